/* The compressed adapter codec: a safetensors LoRA adapter (and optionally its
 * adapter_config.json) in one file that is small, verifiable and decodes back to the
 * original bytes exactly.
 *
 * Why byte-shuffle: in a float tensor the high byte of every element (sign and
 * exponent) takes few values while the low bytes are nearly random. Grouping byte k of
 * every element together turns the predictable bytes into long, compressible runs that
 * an interleaved layout hides from zstd.
 *
 * File layout (".lmz"; all integers little-endian):
 *
 *   offset size
 *   0      4    magic "LMAZ"
 *   4      2    version (1)
 *   6      2    zstd level used (LM_ADAPTER_ZSTD_LEVEL; informative)
 *   8      8    dtype shared by every tensor, NUL-padded ASCII ("BF16")
 *   16     8    size of the original safetensors file
 *   24     8    N: length of its JSON header (the file's leading u64)
 *   32     4    number of data segments S
 *   36     4    length of the adapter_config.json text (0: none travels with it)
 *   40     8    compressed size of the header frame
 *   48     8    compressed size of the config frame (0 when the config length is 0)
 *   56     8    reserved, 0
 *   64     S x 24: per segment u64 raw size, u64 compressed size, u32 shuffle width
 *                  (1, 2, 4 or 8 bytes), u32 reserved 0
 *   then the header frame (the N header bytes verbatim, padding included), the
 *   config frame, and the S segment frames, back to back, nothing after.
 *
 * Segments cover the safetensors data section in order: one per non-empty tensor
 * (shuffled by its element size), plus unshuffled segments for any bytes between or
 * after tensors, so even an irregular file is restored byte-identical. Every frame
 * is one zstd frame at level LM_ADAPTER_ZSTD_LEVEL with its content checksum on, so
 * a flipped bit is caught by zstd even without an expected digest.
 *
 * Digest: the first 16 hex digits of the SHA-256 of the whole compressed file. It is
 * what the fuser keys its cache on; pass it back as `expected_digest` to detect a
 * substituted or damaged file.
 *
 * Untrusted input: every size is checked against the file and against the caller's
 * limit before anything is allocated; failures are LM_ERR_FORMAT (truncated, corrupt,
 * inconsistent), LM_ERR_LIMIT (bigger than allowed), LM_ERR_UNSUPPORTED (another
 * version), each with a sentence naming the file and the part. */
#ifndef LM_ADAPTERS_CODEC_H
#define LM_ADAPTERS_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "lumen.h"
#include "tensor/dtype.h"

#define LM_ADAPTER_ZSTD_LEVEL 19               /* fixed: same input -> same file -> same digest */
#define LM_ADAPTER_MAGIC "LMAZ"
#define LM_ADAPTER_VERSION 1
#define LM_ADAPTER_FIXED_HEADER 64
#define LM_ADAPTER_DIGEST_LEN 16                /* hex digits, without the NUL */
#define LM_ADAPTER_MAX_CONFIG (1u << 20)        /* bytes of adapter_config.json */
#define LM_ADAPTER_DEFAULT_MAX_DECODED ((uint64_t)64 << 30) /* 64 GiB */

/* ---- in memory ------------------------------------------------------------------ */

/* Compresses the safetensors bytes `st` (validated first) and, if `config` is not
 * NULL, `config_len` bytes of adapter_config.json text. *out is malloc'ed (free()).
 * Errors: the file is not valid safetensors, has no tensors, or its tensors have
 * different dtypes (the sentence names two of them). */
lm_status lm_adapter_encode_memory(const void *st, size_t st_len, const char *config, size_t config_len,
                                   uint8_t **out, size_t *out_len);

/* Restores the safetensors bytes (and the config text, NUL-terminated, or NULL when
 * none travelled; pass config_out NULL to skip it). `expected_digest` (NULL: no check)
 * must equal the file's digest. `max_decoded` bounds the restored size (0: the
 * default of 64 GiB). Outputs are malloc'ed; on failure they are NULL. */
lm_status lm_adapter_decode_memory(const void *z, size_t z_len, const char *expected_digest, uint64_t max_decoded,
                                   uint8_t **st_out, size_t *st_len, char **config_out);

/* Digest of compressed bytes: 16 lowercase hex digits + NUL into out[17]. */
lm_status lm_adapter_digest_memory(const void *z, size_t z_len, char out[LM_ADAPTER_DIGEST_LEN + 1]);

/* What the fixed header says, without decompressing anything. */
typedef struct lm_adapter_info {
    lm_dtype dtype;
    char dtype_name[9];
    uint64_t original_size;  /* bytes of the safetensors file */
    uint32_t n_segments;
    uint32_t config_len;     /* 0: no adapter_config.json inside */
    int level;
} lm_adapter_info;

lm_status lm_adapter_info_memory(const void *z, size_t z_len, lm_adapter_info *out);

/* ---- files -------------------------------------------------------------------- */

/* `in` is a safetensors file or an adapter folder (adapters.safetensors or
 * adapter_model.safetensors, with its adapter_config.json, which then travels inside).
 * Writes `out` atomically (out.tmp, then rename). */
lm_status lm_adapter_encode(const char *in, const char *out);

/* Writes the restored safetensors file to `out` and, when config_out is not NULL and
 * a config travelled, the config to `config_out`; both atomically. Nothing is written
 * unless the whole file decoded and (if given) the digest matched. */
lm_status lm_adapter_decode(const char *in, const char *out, const char *config_out, const char *expected_digest);

/* Digest of a compressed file (streamed; the file is not decoded). */
lm_status lm_adapter_digest(const char *path, char out[LM_ADAPTER_DIGEST_LEN + 1]);

/* The shared dtype, read from the first 64 bytes only. */
lm_status lm_adapter_dtype(const char *path, lm_dtype *out);

/* Reads a whole file into a malloc'ed buffer of at most `limit` bytes (shared helper
 * of the adapter code). */
lm_status lm_adapter_read_file(const char *path, uint64_t limit, uint8_t **out, size_t *len);
/* Writes `len` bytes to `path` via path.tmp + fsync + rename. */
lm_status lm_adapter_write_file_atomic(const char *path, const void *data, size_t len);

#endif
