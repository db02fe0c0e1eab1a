/*
 * sha256.h — SHA-256 (FIPS 180-4), for the JIT cache's keys and the digests
 * that verify a cached file before it is loaded (core/cache.h). Fields are
 * hashed with their length in front, so that no two different field lists
 * give one byte stream.
 */
#ifndef FI_CORE_SHA256_H
#define FI_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define FI_SHA256_BYTES 32

typedef struct fi_sha256 {
    uint32_t h[8];
    uint64_t length;   /* bytes hashed so far */
    uint8_t block[64];
    size_t fill;       /* bytes of block in use */
} fi_sha256;

void fi_sha256_init(fi_sha256 *s);
void fi_sha256_update(fi_sha256 *s, const void *data, size_t n);
void fi_sha256_final(fi_sha256 *s, uint8_t digest[FI_SHA256_BYTES]);
/* One field: its length (8 bytes, little-endian), then its bytes. */
void fi_sha256_field(fi_sha256 *s, const void *data, size_t n);
void fi_sha256_str(fi_sha256 *s, const char *str);
/* The digest of one buffer. */
void fi_sha256_of(const void *data, size_t n, uint8_t digest[FI_SHA256_BYTES]);
/* The first `bytes` bytes of a digest as lowercase hex, NUL-terminated
 * (hex holds 2 x bytes + 1). */
void fi_sha256_hex(const uint8_t *digest, size_t bytes, char *hex);

#endif /* FI_CORE_SHA256_H */
