/* proto/codec_int.h -- what proto/codec.c shares with the decoders written
 * by hand in proto/ (not for other layers). */
#ifndef SW_CODEC_INT_H
#define SW_CODEC_INT_H

#include "proto/sw_codec.h"

/* The allocation bound and caps of every protobuf-c decode (codec.c):
 * SW_OK, or SW_EPROTO. */
sw_err swp_precheck(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len);
/* The checks of a decoded StreamItemWrapper (version, ids, batch order,
 * terminals, event names): SW_OK, SW_EVERSION or SW_EPROTO. */
sw_err swp_check_item(swp_item *m);
/* swp_decode_item_arena through protobuf-c (len <= max already checked,
 * out and a not NULL): for what proto/items.c leaves to it. */
sw_err swp_decode_item_pbc(const uint8_t *buf, size_t len, size_t max, swp_arena *a,
                           swp_item **out);
/* The checks of a decoded Request (version, ids, subject, endpoint,
 * windows, headers): SW_OK, SW_EVERSION or SW_EPROTO. */
sw_err swp_check_request(swp_request *m);
/* swp_decode_request_arena through protobuf-c, as swp_decode_item_pbc. */
sw_err swp_decode_request_pbc(const uint8_t *buf, size_t len, size_t max, swp_arena *a,
                              swp_request **out);

#endif
