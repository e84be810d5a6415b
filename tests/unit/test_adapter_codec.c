/* The compressed adapter codec:
 *  - encode -> decode is byte-identical for F32, F16 and BF16 random LoRAs of SmolLM2
 *    and Gemma 3 shapes in the MLX and PEFT layouts, config included;
 *  - byte-shuffle pays: BF16 adapters compress smaller than plain zstd of the same file
 *    at the same level;
 *  - digest is the first 16 hex digits of SHA-256 of the file; dtype reads the header;
 *  - irregular files (gaps between tensors) still round-trip;
 *  - bad input: mixed dtypes, truncated or corrupt files, digest mismatch, wrong magic —
 *    clear errors, and a failed decode writes no file. */
#include <openssl/evp.h>
#include <zstd.h>

#include "adapters/codec.h"
#include "test.h"
#include "test_adapter_util.h"

static char g_dir[256];

static uint8_t *read_all(const char *path, size_t *len) {
    uint8_t *b = NULL;
    if (lm_adapter_read_file(path, (uint64_t)1 << 32, &b, len) != LM_OK) return NULL;
    return b;
}

static void round_trip(const char *label, lora_shape shape, lm_dtype dtype, bool peft) {
    char dir[512], lmz[600], out[600], cfg_out[600], src[600];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, label);
    lora_spec s = {shape, 0, 3, 8, 0x7f, dtype, peft, 1.0f, 0.02f, 2.0f, 42};
    test_lora L;
    CHECK(tl_write_adapter(dir, &s, &L) == LM_OK);
    tl_free(&L);
    snprintf(src, sizeof src, "%s/%s", dir, peft ? "adapter_model.safetensors" : "adapters.safetensors");
    snprintf(lmz, sizeof lmz, "%s.lmz", dir);
    snprintf(out, sizeof out, "%s.restored", dir);
    snprintf(cfg_out, sizeof cfg_out, "%s.config.json", dir);
    if (lm_adapter_encode(dir, lmz) != LM_OK) fprintf(stderr, "encode %s: %s\n", label, lm_last_error());
    char digest[LM_ADAPTER_DIGEST_LEN + 1];
    CHECK(lm_adapter_digest(lmz, digest) == LM_OK);
    CHECK(lm_adapter_decode(lmz, out, cfg_out, digest) == LM_OK);
    size_t a_len = 0, b_len = 0, z_len = 0, c_len = 0, c2_len = 0;
    uint8_t *a = read_all(src, &a_len), *b = read_all(out, &b_len), *z = read_all(lmz, &z_len);
    char cfg_path[600];
    snprintf(cfg_path, sizeof cfg_path, "%s/adapter_config.json", dir);
    uint8_t *c = read_all(cfg_path, &c_len), *c2 = read_all(cfg_out, &c2_len);
    CHECK(a && b && z && c && c2);
    CHECK(a_len == b_len && a && b && memcmp(a, b, a_len) == 0);
    CHECK(c_len == c2_len && c && c2 && memcmp(c, c2, c_len) == 0);

    /* the digest is SHA-256 of the compressed bytes, first 16 hex digits */
    unsigned char md[32];
    unsigned int md_len = 0;
    EVP_Digest(z, z_len, md, &md_len, EVP_sha256(), NULL);
    char hex[17];
    for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    CHECK(strcmp(hex, digest) == 0);
    lm_dtype dt;
    CHECK(lm_adapter_dtype(lmz, &dt) == LM_OK && dt == dtype);

    /* plain zstd of the same file at the same level */
    size_t bound = ZSTD_compressBound(a_len);
    void *plain = malloc(bound);
    size_t plain_len = ZSTD_compress(plain, bound, a, a_len, LM_ADAPTER_ZSTD_LEVEL);
    CHECK(!ZSTD_isError(plain_len));
    fprintf(stderr, "%-22s %8zu bytes: shuffled+zstd %8zu (ratio %.3f), plain zstd %8zu (ratio %.3f)\n", label, a_len,
            z_len, (double)a_len / (double)z_len, plain_len, (double)a_len / (double)plain_len);
    if (dtype == LM_DTYPE_BF16) CHECK(z_len < plain_len);
    free(plain);
    free(a), free(b), free(z), free(c), free(c2);
}

static void test_mixed_dtypes(void) {
    lm_safetensors_writer *w = lm_safetensors_writer_create();
    float f[4] = {1, 2, 3, 4};
    uint16_t h[4] = {1, 2, 3, 4};
    int64_t shape[2] = {2, 2};
    lm_safetensors_writer_add(w, "model.layers.0.self_attn.q_proj.lora_a", LM_DTYPE_F32, 2, shape, f);
    lm_safetensors_writer_add(w, "model.layers.0.self_attn.q_proj.lora_b", LM_DTYPE_BF16, 2, shape, h);
    char path[600], out[600];
    snprintf(path, sizeof path, "%s/mixed.safetensors", g_dir);
    snprintf(out, sizeof out, "%s/mixed.lmz", g_dir);
    CHECK(lm_safetensors_writer_write(w, path) == LM_OK);
    lm_safetensors_writer_free(w);
    CHECK(lm_adapter_encode(path, out) == LM_ERR_FORMAT);
    const char *e = lm_last_error();
    fprintf(stderr, "mixed dtypes -> %s\n", e);
    CHECK(strstr(e, "mixed dtypes") && strstr(e, "q_proj.lora_a") && strstr(e, "q_proj.lora_b") &&
          strstr(e, "F32") && strstr(e, "BF16"));
    CHECK(access(out, F_OK) != 0);
}

/* A file with bytes between and after tensors (the writer never makes one) and an
 * empty tensor. */
static void test_irregular(void) {
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
                      "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[12,12]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]}}";
    size_t hl = strlen(hdr), n = 8 + hl + 23;
    uint8_t *f = calloc(1, n);
    for (int i = 0; i < 8; i++) f[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(f + 8, hdr, hl);
    for (size_t i = 8 + hl; i < n; i++) f[i] = (uint8_t)(i * 7);
    uint8_t *z = NULL, *back = NULL;
    size_t zl = 0, bl = 0;
    CHECK(lm_adapter_encode_memory(f, n, NULL, 0, &z, &zl) == LM_OK);
    char *cfg = (char *)1;
    CHECK(lm_adapter_decode_memory(z, zl, NULL, 0, &back, &bl, &cfg) == LM_OK);
    CHECK(bl == n && back && memcmp(back, f, n) == 0);
    CHECK(cfg == NULL);
    free(f), free(z), free(back);
}

static void test_bad_input(void) {
    char dir[512], lmz[600], out[600];
    snprintf(dir, sizeof dir, "%s/bad", g_dir);
    lora_spec s = {k_smollm2_135m, 0, 1, 4, 0x3, LM_DTYPE_BF16, true, 1.0f, 0.02f, 2.0f, 7};
    test_lora L;
    CHECK(tl_write_adapter(dir, &s, &L) == LM_OK);
    tl_free(&L);
    snprintf(lmz, sizeof lmz, "%s.lmz", dir);
    snprintf(out, sizeof out, "%s.out", dir);
    CHECK(lm_adapter_encode(dir, lmz) == LM_OK);
    size_t zl = 0;
    uint8_t *z = read_all(lmz, &zl);
    CHECK(z != NULL);
    if (!z) return;
    uint8_t *st = NULL;
    size_t sl = 0;

    /* every truncation is an error, never a crash or a partial result */
    int truncated_ok = 0, checked = 0;
    for (size_t cut = 0; cut < zl; cut += (cut < 200 ? 1 : 97)) {
        checked++;
        lm_status r = lm_adapter_decode_memory(z, cut, NULL, 0, &st, &sl, NULL);
        if (r == LM_ERR_FORMAT && st == NULL) truncated_ok++;
        free(st);
        st = NULL;
    }
    CHECK(truncated_ok == checked);
    CHECK(lm_adapter_decode_memory(z, zl - 1, NULL, 0, &st, &sl, NULL) == LM_ERR_FORMAT);
    fprintf(stderr, "truncated -> %s\n", lm_last_error());
    CHECK(strstr(lm_last_error(), "truncated") != NULL);

    /* a flipped byte anywhere in the payload: zstd's checksum or structure catches it,
     * or the flip hit a field that does not change the content (a frame's window
     * size) and the file still decodes to the original bytes */
    uint8_t *orig = NULL;
    size_t orig_len = 0;
    CHECK(lm_adapter_decode_memory(z, zl, NULL, 0, &orig, &orig_len, NULL) == LM_OK);
    int corrupt_ok = 0, tried = 0, benign = 0;
    uint8_t *c = malloc(zl);
    for (size_t pos = LM_ADAPTER_FIXED_HEADER; pos < zl; pos += zl / 61 + 1) {
        memcpy(c, z, zl);
        c[pos] ^= 0x5a;
        tried++;
        lm_status r = lm_adapter_decode_memory(c, zl, NULL, 0, &st, &sl, NULL);
        if (r != LM_OK && st == NULL) corrupt_ok++;
        if (r == LM_OK && sl == orig_len && memcmp(st, orig, sl) == 0) corrupt_ok++, benign++;
        free(st);
        st = NULL;
    }
    CHECK(corrupt_ok == tried);
    fprintf(stderr, "%d byte flips: %d rejected, %d harmless\n", tried, tried - benign, benign);
    free(orig);
    memcpy(c, z, zl);
    c[zl - 10] ^= 1;
    CHECK(lm_adapter_decode_memory(c, zl, NULL, 0, &st, &sl, NULL) == LM_ERR_FORMAT);
    fprintf(stderr, "corrupt -> %s\n", lm_last_error());
    CHECK(strstr(lm_last_error(), "corrupt") != NULL);

    /* corrupt file on disk: decode fails and writes nothing */
    char bad[600];
    snprintf(bad, sizeof bad, "%s.corrupt.lmz", dir);
    CHECK(lm_adapter_write_file_atomic(bad, c, zl) == LM_OK);
    CHECK(lm_adapter_decode(bad, out, NULL, NULL) == LM_ERR_FORMAT);
    CHECK(access(out, F_OK) != 0);
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    CHECK(access(tmp, F_OK) != 0);

    /* digest mismatch */
    CHECK(lm_adapter_decode(lmz, out, NULL, "0123456789abcdef") == LM_ERR_FORMAT);
    fprintf(stderr, "digest mismatch -> %s\n", lm_last_error());
    CHECK(strstr(lm_last_error(), "digest mismatch") != NULL);
    CHECK(access(out, F_OK) != 0);

    /* wrong magic, other version, limit */
    memcpy(c, z, zl);
    c[0] = 'X';
    CHECK(lm_adapter_decode_memory(c, zl, NULL, 0, &st, &sl, NULL) == LM_ERR_FORMAT);
    CHECK(strstr(lm_last_error(), "magic") != NULL);
    memcpy(c, z, zl);
    c[4] = 9;
    CHECK(lm_adapter_decode_memory(c, zl, NULL, 0, &st, &sl, NULL) == LM_ERR_UNSUPPORTED);
    CHECK(lm_adapter_decode_memory(z, zl, NULL, 100, &st, &sl, NULL) == LM_ERR_LIMIT);
    /* trailing garbage */
    uint8_t *longer = malloc(zl + 3);
    memcpy(longer, z, zl);
    memset(longer + zl, 0, 3);
    CHECK(lm_adapter_decode_memory(longer, zl + 3, NULL, 0, &st, &sl, NULL) == LM_ERR_FORMAT);
    free(longer);
    /* the dtype reader on a too-short file */
    snprintf(bad, sizeof bad, "%s.short.lmz", dir);
    CHECK(lm_adapter_write_file_atomic(bad, z, 20) == LM_OK);
    lm_dtype dt;
    CHECK(lm_adapter_dtype(bad, &dt) == LM_ERR_FORMAT);
    /* not safetensors at all */
    CHECK(lm_adapter_encode(bad, out) != LM_OK);
    CHECK(access(out, F_OK) != 0);
    free(c);
    free(z);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/lumen_test_adapter_codec_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    static const struct {
        const char *name;
        lm_dtype t;
    } types[] = {{"f32", LM_DTYPE_F32}, {"f16", LM_DTYPE_F16}, {"bf16", LM_DTYPE_BF16}};
    for (int t = 0; t < 3; t++)
        for (int model = 0; model < 2; model++)
            for (int peft = 0; peft < 2; peft++) {
                char label[64];
                snprintf(label, sizeof label, "%s_%s_%s", model ? "gemma3" : "smollm2", peft ? "peft" : "mlx",
                         types[t].name);
                round_trip(label, model ? k_gemma3_270m : k_smollm2_135m, types[t].t, peft);
            }
    test_mixed_dtypes();
    test_irregular();
    test_bad_input();
    tl_rm_tree(g_dir);
    TEST_MAIN_END();
}
