/* streamwire/export.h -- symbol visibility. Symbols are hidden by default
 * (-fvisibility=hidden); SW_API marks the public ones. SW_STATIC is defined for
 * consumers of the static library by the streamwire_static CMake target; it
 * only matters on Windows, where it drops __declspec(dllimport). */
#ifndef STREAMWIRE_EXPORT_H
#define STREAMWIRE_EXPORT_H

#if defined(_WIN32) && !defined(SW_STATIC)
#ifdef SW_BUILDING
#define SW_API __declspec(dllexport)
#else
#define SW_API __declspec(dllimport)
#endif
#elif defined(__GNUC__)
#define SW_API __attribute__((visibility("default")))
#else
#define SW_API
#endif

#if defined(__GNUC__)
#define SW_NODISCARD __attribute__((warn_unused_result))
#else
#define SW_NODISCARD
#endif

#endif
