/* The adapter codec: byte-shuffle + zstd over a safetensors file (format in codec.h). */
#include "adapters/codec.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "core/error.h"
#include "formats/safetensors.h"

enum { SEG_BYTES = 24, MAX_SEGMENTS = 1 << 20 };

/* ---- little-endian fields ---------------------------------------------------------- */

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* ---- byte shuffle ------------------------------------------------------------------ */

/* dst[k * n + i] = src[i * width + k]: byte k of every element together. */
static void shuffle(const uint8_t *src, uint8_t *dst, size_t n, size_t width) {
    for (size_t k = 0; k < width; k++) {
        uint8_t *d = dst + k * n;
        const uint8_t *s = src + k;
        for (size_t i = 0; i < n; i++) d[i] = s[i * width];
    }
}

static void unshuffle(const uint8_t *src, uint8_t *dst, size_t n, size_t width) {
    for (size_t k = 0; k < width; k++) {
        const uint8_t *s = src + k * n;
        uint8_t *d = dst + k;
        for (size_t i = 0; i < n; i++) d[i * width] = s[i];
    }
}

/* ---- encode -------------------------------------------------------------------------- */

typedef struct segment {
    uint64_t offset, raw, width; /* within the data section */
} segment;

typedef struct out_buf {
    uint8_t *p;
    size_t len, cap;
} out_buf;

static lm_status out_reserve(out_buf *o, size_t extra) {
    if (o->len + extra <= o->cap) return LM_OK;
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + extra) cap *= 2;
    uint8_t *p = realloc(o->p, cap);
    if (!p) return lm_error(LM_ERR_NO_MEMORY, "adapter codec: out of memory");
    o->p = p;
    o->cap = cap;
    return LM_OK;
}

/* Appends one zstd frame of `src` and returns its compressed size. */
static lm_status out_frame(out_buf *o, ZSTD_CCtx *cctx, const void *src, size_t n, uint64_t *zlen) {
    size_t bound = ZSTD_compressBound(n);
    lm_status st = out_reserve(o, bound);
    if (st) return st;
    size_t r = ZSTD_compress2(cctx, o->p + o->len, bound, src, n);
    if (ZSTD_isError(r)) return lm_error(LM_ERR_INTERNAL, "adapter codec: zstd failed: %s", ZSTD_getErrorName(r));
    o->len += r;
    *zlen = r;
    return LM_OK;
}

/* The shared dtype of all tensors; mixed dtypes name two tensors that differ. */
static lm_status shared_dtype(const lm_safetensors *sf, lm_dtype *out) {
    int64_t n = lm_safetensors_n_tensors(sf);
    if (n == 0) return lm_error(LM_ERR_FORMAT, "adapter has no tensors");
    const lm_tensor *first = lm_safetensors_tensor(sf, 0);
    for (int64_t i = 1; i < n; i++) {
        const lm_tensor *t = lm_safetensors_tensor(sf, i);
        if (t->type != first->type)
            return lm_error(LM_ERR_FORMAT,
                            "adapter tensors have mixed dtypes: '%s' is %s but '%s' is %s (the codec needs one dtype)",
                            first->name, lm_dtype_name(first->type), t->name, lm_dtype_name(t->type));
    }
    *out = first->type;
    return LM_OK;
}

lm_status lm_adapter_encode_memory(const void *st_bytes, size_t st_len, const char *config, size_t config_len,
                                   uint8_t **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (config && config_len > LM_ADAPTER_MAX_CONFIG)
        return lm_error(LM_ERR_LIMIT, "adapter_config.json is larger than %u bytes", LM_ADAPTER_MAX_CONFIG);
    if (!config) config_len = 0;
    lm_safetensors *sf = NULL;
    lm_status st = lm_safetensors_open_memory(st_bytes, st_len, &sf);
    if (st) return lm_error_prefix(st, "adapter");
    lm_dtype dtype = LM_DTYPE_F32;
    if ((st = shared_dtype(sf, &dtype))) {
        lm_safetensors_close(sf);
        return st;
    }
    const uint8_t *bytes = st_bytes;
    uint64_t hlen = get_u64(bytes); /* validated by the reader */
    const uint8_t *data = bytes + 8 + hlen;
    uint64_t data_len = st_len - 8 - hlen;
    size_t width = lm_dtype_get_info(dtype)->block_bytes;

    /* segments: tensors in data order, gaps between them unshuffled */
    int64_t nt = lm_safetensors_n_tensors(sf);
    segment *segs = calloc((size_t)(2 * nt + 1), sizeof *segs);
    if (!segs) {
        lm_safetensors_close(sf);
        return lm_error(LM_ERR_NO_MEMORY, "adapter codec: out of memory");
    }
    size_t ns = 0;
    uint64_t pos = 0;
    for (int64_t i = 0; i < nt; i++) {
        const lm_tensor *t = lm_safetensors_tensor(sf, i);
        if (t->nbytes == 0) continue;
        uint64_t off = (uint64_t)((const uint8_t *)t->data - data);
        if (off > pos) segs[ns++] = (segment){pos, off - pos, 1};
        segs[ns++] = (segment){off, t->nbytes, width};
        pos = off + t->nbytes;
    }
    if (pos < data_len) segs[ns++] = (segment){pos, data_len - pos, 1};
    lm_safetensors_close(sf);

    out_buf o = {0};
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    uint8_t *scratch = NULL;
    size_t max_seg = 0;
    for (size_t i = 0; i < ns; i++)
        if (segs[i].width > 1 && segs[i].raw > max_seg) max_seg = segs[i].raw;
    if (max_seg) scratch = malloc(max_seg);
    if (!cctx || (max_seg && !scratch)) {
        st = lm_error(LM_ERR_NO_MEMORY, "adapter codec: out of memory");
        goto done;
    }
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, LM_ADAPTER_ZSTD_LEVEL);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);

    size_t table = LM_ADAPTER_FIXED_HEADER + ns * SEG_BYTES;
    if ((st = out_reserve(&o, table))) goto done;
    memset(o.p, 0, table);
    o.len = table;
    uint64_t hz = 0, cz = 0;
    if ((st = out_frame(&o, cctx, bytes + 8, hlen, &hz))) goto done;
    if (config_len && (st = out_frame(&o, cctx, config, config_len, &cz))) goto done;
    for (size_t i = 0; i < ns; i++) {
        const uint8_t *src = data + segs[i].offset;
        if (segs[i].width > 1) {
            shuffle(src, scratch, segs[i].raw / segs[i].width, segs[i].width);
            src = scratch;
        }
        uint64_t z = 0;
        if ((st = out_frame(&o, cctx, src, segs[i].raw, &z))) goto done;
        uint8_t *e = o.p + LM_ADAPTER_FIXED_HEADER + i * SEG_BYTES;
        put_u64(e, segs[i].raw);
        put_u64(e + 8, z);
        put_u32(e + 16, (uint32_t)segs[i].width);
    }
    uint8_t *h = o.p;
    memcpy(h, LM_ADAPTER_MAGIC, 4);
    put_u16(h + 4, LM_ADAPTER_VERSION);
    put_u16(h + 6, LM_ADAPTER_ZSTD_LEVEL);
    const char *dn = lm_dtype_name(dtype);
    memcpy(h + 8, dn, strlen(dn) < 8 ? strlen(dn) : 8);
    put_u64(h + 16, st_len);
    put_u64(h + 24, hlen);
    put_u32(h + 32, (uint32_t)ns);
    put_u32(h + 36, (uint32_t)config_len);
    put_u64(h + 40, hz);
    put_u64(h + 48, cz);
    *out = o.p;
    *out_len = o.len;
    o.p = NULL;
done:
    free(o.p);
    free(scratch);
    free(segs);
    ZSTD_freeCCtx(cctx);
    return st;
}

/* ---- digest -------------------------------------------------------------------------- */

static void to_hex(const unsigned char *md, char out[LM_ADAPTER_DIGEST_LEN + 1]) {
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < LM_ADAPTER_DIGEST_LEN / 2; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    out[LM_ADAPTER_DIGEST_LEN] = '\0';
}

lm_status lm_adapter_digest_memory(const void *z, size_t z_len, char out[LM_ADAPTER_DIGEST_LEN + 1]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    if (!EVP_Digest(z, z_len, md, &md_len, EVP_sha256(), NULL) || md_len != 32)
        return lm_error(LM_ERR_INTERNAL, "SHA-256 failed");
    to_hex(md, out);
    return LM_OK;
}

lm_status lm_adapter_digest(const char *path, char out[LM_ADAPTER_DIGEST_LEN + 1]) {
    FILE *f = fopen(path, "rb");
    if (!f) return lm_error(LM_ERR_IO, "cannot open adapter %s: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char buf[1 << 16];
    bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0) ok = EVP_DigestUpdate(ctx, buf, n);
    bool rerr = ferror(f);
    fclose(f);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    ok = ok && EVP_DigestFinal_ex(ctx, md, &md_len) && md_len == 32;
    EVP_MD_CTX_free(ctx);
    if (rerr) return lm_error(LM_ERR_IO, "cannot read adapter %s", path);
    if (!ok) return lm_error(LM_ERR_INTERNAL, "SHA-256 failed");
    to_hex(md, out);
    return LM_OK;
}

/* ---- decode ---------------------------------------------------------------------------- */

lm_status lm_adapter_info_memory(const void *zv, size_t z_len, lm_adapter_info *out) {
    const uint8_t *z = zv;
    memset(out, 0, sizeof *out);
    if (z_len < LM_ADAPTER_FIXED_HEADER)
        return lm_error(LM_ERR_FORMAT, "compressed adapter is truncated: %zu bytes, the header alone is %d", z_len,
                        LM_ADAPTER_FIXED_HEADER);
    if (memcmp(z, LM_ADAPTER_MAGIC, 4) != 0)
        return lm_error(LM_ERR_FORMAT, "not a compressed adapter (bad magic; expected \"%s\")", LM_ADAPTER_MAGIC);
    uint16_t version = get_u16(z + 4);
    if (version != LM_ADAPTER_VERSION)
        return lm_error(LM_ERR_UNSUPPORTED, "compressed adapter version %u is not supported (this build reads %d)",
                        version, LM_ADAPTER_VERSION);
    char name[9] = {0};
    memcpy(name, z + 8, 8);
    lm_dtype dt;
    if (!lm_dtype_from_name(name, &dt) || dt == LM_DTYPE_AFFINE || lm_dtype_get_info(dt)->quantized ||
        lm_dtype_get_info(dt)->block_bytes > 8)
        return lm_error(LM_ERR_FORMAT, "compressed adapter names an unknown dtype");
    if (get_u64(z + 56) != 0) return lm_error(LM_ERR_FORMAT, "compressed adapter header has nonzero reserved bytes");
    out->dtype = dt;
    memcpy(out->dtype_name, name, sizeof name);
    out->original_size = get_u64(z + 16);
    out->n_segments = get_u32(z + 32);
    out->config_len = get_u32(z + 36);
    out->level = get_u16(z + 6);
    return LM_OK;
}

static lm_status frame(ZSTD_DCtx *d, const uint8_t *src, uint64_t zlen, uint8_t *dst, uint64_t raw,
                       const char *what) {
    unsigned long long fcs = ZSTD_getFrameContentSize(src, zlen);
    if (fcs == ZSTD_CONTENTSIZE_ERROR || (fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs != raw))
        return lm_error(LM_ERR_FORMAT, "compressed adapter is corrupt: the %s frame is damaged", what);
    size_t r = ZSTD_decompressDCtx(d, dst, raw, src, zlen);
    if (ZSTD_isError(r))
        return lm_error(LM_ERR_FORMAT, "compressed adapter is corrupt: the %s frame does not decode (%s)", what,
                        ZSTD_getErrorName(r));
    if (r != raw)
        return lm_error(LM_ERR_FORMAT, "compressed adapter is corrupt: the %s frame holds %zu bytes, expected %llu",
                        what, r, (unsigned long long)raw);
    return LM_OK;
}

lm_status lm_adapter_decode_memory(const void *zv, size_t z_len, const char *expected_digest, uint64_t max_decoded,
                                   uint8_t **st_out, size_t *st_len, char **config_out) {
    *st_out = NULL;
    *st_len = 0;
    if (config_out) *config_out = NULL;
    const uint8_t *z = zv;
    if (max_decoded == 0) max_decoded = LM_ADAPTER_DEFAULT_MAX_DECODED;
    if (expected_digest) {
        char got[LM_ADAPTER_DIGEST_LEN + 1];
        lm_status st = lm_adapter_digest_memory(z, z_len, got);
        if (st) return st;
        if (strcmp(got, expected_digest) != 0)
            return lm_error(LM_ERR_FORMAT, "compressed adapter digest mismatch: expected %s, the file's is %s",
                            expected_digest, got);
    }
    lm_adapter_info info;
    lm_status st = lm_adapter_info_memory(z, z_len, &info);
    if (st) return st;
    uint64_t file_size = info.original_size, hlen = get_u64(z + 24);
    uint64_t hz = get_u64(z + 40), cz = get_u64(z + 48);
    uint32_t ns = info.n_segments, clen = info.config_len;
    if (file_size > max_decoded)
        return lm_error(LM_ERR_LIMIT, "compressed adapter decodes to %llu bytes, above the limit of %llu",
                        (unsigned long long)file_size, (unsigned long long)max_decoded);
    if (hlen < 2 || hlen > LM_ST_MAX_HEADER || file_size < 8 || hlen > file_size - 8)
        return lm_error(LM_ERR_FORMAT, "compressed adapter is corrupt: header length %llu does not fit the %llu-byte file",
                        (unsigned long long)hlen, (unsigned long long)file_size);
    if (clen > LM_ADAPTER_MAX_CONFIG || (clen == 0) != (cz == 0))
        return lm_error(LM_ERR_FORMAT, "compressed adapter is corrupt: bad config sizes");
    if (ns > MAX_SEGMENTS || (uint64_t)ns * SEG_BYTES > z_len - LM_ADAPTER_FIXED_HEADER)
        return lm_error(LM_ERR_FORMAT, "compressed adapter is truncated: its segment table (%u entries) is cut off", ns);
    /* the table must account for every byte: no hole, no trailing data */
    uint64_t need = LM_ADAPTER_FIXED_HEADER + (uint64_t)ns * SEG_BYTES, data_raw = 0;
    const uint8_t *table = z + LM_ADAPTER_FIXED_HEADER;
    uint64_t parts[2] = {hz, cz};
    for (int i = 0; i < 2; i++) {
        if (parts[i] > UINT64_MAX - need) return lm_error(LM_ERR_FORMAT, "compressed adapter is corrupt: sizes overflow");
        need += parts[i];
    }
    for (uint32_t i = 0; i < ns; i++) {
        const uint8_t *e = table + (size_t)i * SEG_BYTES;
        uint64_t raw = get_u64(e), zl = get_u64(e + 8);
        uint32_t w = get_u32(e + 16);
        if ((w != 1 && w != 2 && w != 4 && w != 8) || raw % w != 0 || get_u32(e + 20) != 0 || raw == 0)
            return lm_error(LM_ERR_FORMAT, "compressed adapter is corrupt: segment %u has a bad size or width", i);
        if (zl > UINT64_MAX - need || raw > UINT64_MAX - data_raw)
            return lm_error(LM_ERR_FORMAT, "compressed adapter is corrupt: sizes overflow");
        need += zl;
        data_raw += raw;
    }
    if (need > z_len)
        return lm_error(LM_ERR_FORMAT, "compressed adapter is truncated: %zu bytes, its table needs %llu", z_len,
                        (unsigned long long)need);
    if (need < z_len)
        return lm_error(LM_ERR_FORMAT, "compressed adapter has %llu unexpected trailing bytes",
                        (unsigned long long)(z_len - need));
    if (data_raw != file_size - 8 - hlen)
        return lm_error(LM_ERR_FORMAT, "compressed adapter is corrupt: its segments hold %llu bytes, the header says %llu",
                        (unsigned long long)data_raw, (unsigned long long)(file_size - 8 - hlen));
    if (file_size > SIZE_MAX) return lm_error(LM_ERR_LIMIT, "adapter too large for this machine");

    uint8_t *dst = malloc((size_t)file_size);
    char *cfg = NULL;
    uint8_t *scratch = NULL;
    ZSTD_DCtx *d = ZSTD_createDCtx();
    uint64_t max_seg = 0;
    for (uint32_t i = 0; i < ns; i++) {
        const uint8_t *e = table + (size_t)i * SEG_BYTES;
        if (get_u32(e + 16) > 1 && get_u64(e) > max_seg) max_seg = get_u64(e);
    }
    if (max_seg) scratch = malloc((size_t)max_seg);
    if (clen && config_out) cfg = malloc((size_t)clen + 1);
    if (!dst || !d || (max_seg && !scratch) || (clen && config_out && !cfg)) {
        st = lm_error(LM_ERR_NO_MEMORY, "adapter codec: out of memory decoding %llu bytes",
                      (unsigned long long)file_size);
        goto fail;
    }
    put_u64(dst, hlen);
    const uint8_t *src = z + LM_ADAPTER_FIXED_HEADER + (size_t)ns * SEG_BYTES;
    if ((st = frame(d, src, hz, dst + 8, hlen, "header"))) goto fail;
    src += hz;
    if (clen) {
        if (cfg) {
            if ((st = frame(d, src, cz, (uint8_t *)cfg, clen, "config"))) goto fail;
            cfg[clen] = '\0';
        }
        src += cz;
    }
    uint8_t *o = dst + 8 + hlen;
    for (uint32_t i = 0; i < ns; i++) {
        const uint8_t *e = table + (size_t)i * SEG_BYTES;
        uint64_t raw = get_u64(e), zl = get_u64(e + 8);
        uint32_t w = get_u32(e + 16);
        char what[32];
        snprintf(what, sizeof what, "segment %u", i);
        if ((st = frame(d, src, zl, w > 1 ? scratch : o, raw, what))) goto fail;
        if (w > 1) unshuffle(scratch, o, (size_t)(raw / w), w);
        src += zl;
        o += raw;
    }
    /* what came out must be the safetensors file the header described */
    lm_safetensors *sf = NULL;
    if ((st = lm_safetensors_open_memory(dst, (size_t)file_size, &sf))) {
        st = lm_error_prefix(st, "compressed adapter decodes to an invalid safetensors file");
        goto fail;
    }
    lm_safetensors_close(sf);
    free(scratch);
    ZSTD_freeDCtx(d);
    *st_out = dst;
    *st_len = (size_t)file_size;
    if (config_out) *config_out = cfg;
    return LM_OK;
fail:
    free(dst);
    free(cfg);
    free(scratch);
    ZSTD_freeDCtx(d);
    return st;
}

/* ---- files ------------------------------------------------------------------------------ */

lm_status lm_adapter_read_file(const char *path, uint64_t limit, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return lm_error(LM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return lm_error(LM_ERR_IO, "%s is not a regular file", path);
    }
    if ((uint64_t)sb.st_size > limit) {
        fclose(f);
        return lm_error(LM_ERR_LIMIT, "%s is %lld bytes, above the limit of %llu", path, (long long)sb.st_size,
                        (unsigned long long)limit);
    }
    size_t n = (size_t)sb.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        fclose(f);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory reading %s", path);
    }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        free(buf);
        return lm_error(LM_ERR_IO, "cannot read %s", path);
    }
    *out = buf;
    *len = n;
    return LM_OK;
}

lm_status lm_adapter_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return lm_error(LM_ERR_LIMIT, "path %s is too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return lm_error(LM_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    bool ok = fwrite(data, 1, len, f) == len;
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return lm_error(LM_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    return LM_OK;
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

lm_status lm_adapter_encode(const char *in, const char *out) {
    char st_path[4200], cfg_path[4200];
    bool have_cfg = false;
    if (is_dir(in)) {
        snprintf(st_path, sizeof st_path, "%s/adapters.safetensors", in);
        if (!exists(st_path)) snprintf(st_path, sizeof st_path, "%s/adapter_model.safetensors", in);
        if (!exists(st_path))
            return lm_error(LM_ERR_NOT_FOUND, "adapter folder %s has neither adapters.safetensors (MLX) nor "
                                              "adapter_model.safetensors (PEFT)", in);
        snprintf(cfg_path, sizeof cfg_path, "%s/adapter_config.json", in);
        have_cfg = exists(cfg_path);
    } else {
        snprintf(st_path, sizeof st_path, "%s", in);
    }
    uint8_t *st_bytes = NULL, *cfg = NULL, *z = NULL;
    size_t st_len = 0, cfg_len = 0, z_len = 0;
    lm_status st = lm_adapter_read_file(st_path, (uint64_t)1 << 40, &st_bytes, &st_len);
    if (!st && have_cfg) st = lm_adapter_read_file(cfg_path, LM_ADAPTER_MAX_CONFIG, &cfg, &cfg_len);
    if (!st) {
        st = lm_adapter_encode_memory(st_bytes, st_len, have_cfg ? (const char *)cfg : NULL, cfg_len, &z, &z_len);
        if (st) st = lm_error_prefix(st, "%s", st_path);
    }
    if (!st) st = lm_adapter_write_file_atomic(out, z, z_len);
    free(st_bytes);
    free(cfg);
    free(z);
    return st;
}

lm_status lm_adapter_decode(const char *in, const char *out, const char *config_out, const char *expected_digest) {
    uint8_t *z = NULL, *st_bytes = NULL;
    size_t z_len = 0, st_len = 0;
    char *cfg = NULL;
    lm_status st = lm_adapter_read_file(in, (uint64_t)1 << 40, &z, &z_len);
    if (!st) {
        st = lm_adapter_decode_memory(z, z_len, expected_digest, 0, &st_bytes, &st_len, config_out ? &cfg : NULL);
        if (st) st = lm_error_prefix(st, "%s", in);
    }
    if (!st) st = lm_adapter_write_file_atomic(out, st_bytes, st_len);
    if (!st && cfg && config_out) st = lm_adapter_write_file_atomic(config_out, cfg, strlen(cfg));
    free(z);
    free(st_bytes);
    free(cfg);
    return st;
}

lm_status lm_adapter_dtype(const char *path, lm_dtype *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return lm_error(LM_ERR_IO, "cannot open adapter %s: %s", path, strerror(errno));
    uint8_t h[LM_ADAPTER_FIXED_HEADER];
    size_t n = fread(h, 1, sizeof h, f);
    fclose(f);
    lm_adapter_info info;
    lm_status st = lm_adapter_info_memory(h, n, &info);
    if (st) return lm_error_prefix(st, "%s", path);
    *out = info.dtype;
    return LM_OK;
}
