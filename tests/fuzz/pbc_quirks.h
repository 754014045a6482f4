/* tests/fuzz/pbc_quirks.h -- detection of a protobuf-c 1.4 quirk that the
 * fuzz body and the codec tests must know about.
 *
 * protobuf-c rejects a field tag whose field number is 0 only when the tag is
 * a single byte. Written as an over-long varint (0x82 0x00 = field 0,
 * length-delimited) it is accepted and kept as an unknown field with tag 0.
 * Re-encoding writes that tag minimally (0x02), which protobuf-c then
 * rejects: such a decoded message does not survive encode + decode. The
 * codec refuses such messages (swp_has_field0 in proto/codec.c); the fuzz
 * body checks that no decoded message holds one. */
#ifndef SW_PBC_QUIRKS_H
#define SW_PBC_QUIRKS_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* 1 if m or any sub-message it holds has an unknown field with tag 0. */
static int
pbcq_has_tag0(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return 1;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(const void *)(base + f->quantifier_offset);
            ProtobufCMessage *const *v =
                *(ProtobufCMessage *const *const *)(const void *)(base + f->offset);
            for (size_t j = 0; j < n; j++)
                if (v[j] != NULL && pbcq_has_tag0(v[j]))
                    return 1;
        } else {
            const ProtobufCMessage *sub;
            if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                *(const uint32_t *)(const void *)(base + f->quantifier_offset) != f->id)
                continue;
            sub = *(ProtobufCMessage *const *)(const void *)(base + f->offset);
            if (sub != NULL && pbcq_has_tag0(sub))
                return 1;
        }
    }
    return 0;
}

#endif
