/* GGUF reader/writer: round trips through the writer, a hand-built version-2 file,
 * and a catalogue of hostile inputs that must each fail with a clean status. */
#include "formats/gguf.h"
#include "test.h"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* ---- a byte builder for hand-made files ----------------------------------------- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_pad(buf *b, size_t align) {
    static const uint8_t z[64];
    while (b->n % align) put(b, z, 1);
    (void)z;
}

/* A small file: 1 string pair, optional general.alignment, two F32 tensors. Every
 * field can be overridden to produce a specific defect. */
typedef struct spec {
    char magic[4];
    uint32_t version;
    uint64_t n_tensors, n_kv; /* UINT64_MAX: the true count */
    uint64_t key_len;         /* UINT64_MAX: the true length */
    int align_kind;           /* 0 none, 1 u32 value, 2 string value */
    uint32_t align;
    const char *name[2];
    uint32_t n_dims[2];
    uint64_t ne[2][4];
    uint32_t type[2];
    uint64_t offset[2]; /* UINT64_MAX: natural */
    size_t data_bytes;  /* SIZE_MAX: natural */
} spec;

static spec spec_default(void) {
    spec s = {.magic = {'G', 'G', 'U', 'F'},
              .version = 3,
              .n_tensors = UINT64_MAX,
              .n_kv = UINT64_MAX,
              .key_len = UINT64_MAX,
              .name = {"a", "b"},
              .n_dims = {2, 1},
              .ne = {{4, 2, 1, 1}, {8, 1, 1, 1}},
              .type = {0, 0},
              .offset = {UINT64_MAX, UINT64_MAX},
              .data_bytes = SIZE_MAX};
    return s;
}

static buf build(const spec *s) {
    buf b = {0};
    size_t align = s->align_kind == 1 && s->align ? s->align : 32;
    if (align > 4096) align = 32;
    put(&b, s->magic, 4);
    put_u32(&b, s->version);
    put_u64(&b, s->n_tensors != UINT64_MAX ? s->n_tensors : 2);
    put_u64(&b, s->n_kv != UINT64_MAX ? s->n_kv : (s->align_kind ? 2 : 1));
    put_u64(&b, s->key_len != UINT64_MAX ? s->key_len : 12);
    put(&b, "general.name", 12);
    put_u32(&b, LM_GGUF_STRING);
    put_str(&b, "tiny");
    if (s->align_kind == 1) {
        put_str(&b, "general.alignment");
        put_u32(&b, LM_GGUF_U32);
        put_u32(&b, s->align);
    } else if (s->align_kind == 2) {
        put_str(&b, "general.alignment");
        put_u32(&b, LM_GGUF_STRING);
        put_str(&b, "32");
    }
    uint64_t off = 0;
    for (int i = 0; i < 2; i++) {
        put_str(&b, s->name[i]);
        put_u32(&b, s->n_dims[i]);
        for (uint32_t d = 0; d < s->n_dims[i] && d < 4; d++) put_u64(&b, s->ne[i][d]);
        put_u32(&b, s->type[i]);
        put_u64(&b, s->offset[i] != UINT64_MAX ? s->offset[i] : off);
        off += 4 * 8 * 4; /* room for up to 32 floats each, aligned to 32 */
    }
    put_pad(&b, align);
    size_t data = s->data_bytes != SIZE_MAX ? s->data_bytes : 4 * 8 + 128 + 32;
    for (size_t i = 0; i < data; i++) put(&b, "\x01", 1);
    return b;
}

/* Opens a heap copy of exactly `n` bytes (so ASan sees any over-read). */
static lm_status open_bytes(const uint8_t *p, size_t n, lm_gguf **g) {
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, p, n);
    lm_status st = lm_gguf_open_memory(n ? copy : NULL, n, g);
    if (st == LM_OK) {
        /* keep the copy alive for the handle: tests close right away */
        lm_gguf_close(*g);
        *g = NULL;
    }
    free(copy);
    return st;
}

static lm_status open_spec(const spec *s) {
    buf b = build(s);
    lm_gguf *g = NULL;
    lm_status st = open_bytes(b.p, b.n, &g);
    free(b.p);
    return st;
}

static void expect_fail(const spec *s, lm_status code, const char *needle, int line) {
    lm_status st = open_spec(s);
    if (st != code) {
        fprintf(stderr, "line %d: want %d, got %d: %s\n", line, code, st, lm_last_error());
        lm_test_failures++;
    } else if (needle && !strstr(lm_last_error(), needle)) {
        fprintf(stderr, "line %d: message lacks '%s': %s\n", line, needle, lm_last_error());
        lm_test_failures++;
    }
}
#define EXPECT_FAIL(s, code, needle) expect_fail(&(s), (code), (needle), __LINE__)

static void test_spec_valid(void) {
    spec s = spec_default();
    CHECK(open_spec(&s) == LM_OK);
    s.align_kind = 1;
    s.align = 64;
    CHECK(open_spec(&s) == LM_OK);
}

static void test_bad_inputs(void) {
    spec s;
    s = spec_default(); memcpy(s.magic, "GGML", 4); EXPECT_FAIL(s, LM_ERR_FORMAT, "magic");
    s = spec_default(); s.version = 1; EXPECT_FAIL(s, LM_ERR_UNSUPPORTED, "version 1");
    s = spec_default(); s.version = 99; EXPECT_FAIL(s, LM_ERR_UNSUPPORTED, "version 99");
    s = spec_default(); s.version = 0x03000000; EXPECT_FAIL(s, LM_ERR_UNSUPPORTED, "big-endian");
    s = spec_default(); s.n_tensors = UINT64_MAX - 1; EXPECT_FAIL(s, LM_ERR_LIMIT, "tensor count");
    s = spec_default(); s.n_tensors = 1000; EXPECT_FAIL(s, LM_ERR_FORMAT, NULL);
    s = spec_default(); s.n_kv = 1ull << 40; EXPECT_FAIL(s, LM_ERR_LIMIT, "key/value count");
    s = spec_default(); s.n_kv = 5000; EXPECT_FAIL(s, LM_ERR_FORMAT, NULL);
    s = spec_default(); s.key_len = UINT64_MAX - 3; EXPECT_FAIL(s, LM_ERR_FORMAT, "length");
    s = spec_default(); s.key_len = 0; EXPECT_FAIL(s, LM_ERR_FORMAT, "empty");
    s = spec_default(); s.n_dims[0] = 5; EXPECT_FAIL(s, LM_ERR_FORMAT, "n_dims");
    s = spec_default(); s.n_dims[0] = 0xffffffffu; EXPECT_FAIL(s, LM_ERR_FORMAT, "n_dims");
    s = spec_default(); s.ne[0][1] = 1ull << 63; EXPECT_FAIL(s, LM_ERR_FORMAT, "ne[1]");
    s = spec_default(); s.ne[0][0] = 1ull << 40; s.ne[0][1] = 1ull << 40; EXPECT_FAIL(s, LM_ERR_FORMAT, "overflow");
    s = spec_default(); s.ne[0][1] = 1000; EXPECT_FAIL(s, LM_ERR_FORMAT, "outside");
    s = spec_default(); s.offset[1] = 1u << 30; EXPECT_FAIL(s, LM_ERR_FORMAT, "'b'");
    s = spec_default(); s.offset[1] = UINT64_MAX - 31; EXPECT_FAIL(s, LM_ERR_FORMAT, "outside");
    s = spec_default(); s.offset[1] = 8; EXPECT_FAIL(s, LM_ERR_FORMAT, "alignment");
    s = spec_default(); s.offset[1] = 0; EXPECT_FAIL(s, LM_ERR_FORMAT, "overlap");
    s = spec_default(); s.type[1] = 4; EXPECT_FAIL(s, LM_ERR_UNSUPPORTED, "type id 4");
    s = spec_default(); s.type[1] = 1000; EXPECT_FAIL(s, LM_ERR_UNSUPPORTED, "'b'");
    s = spec_default(); s.type[1] = 2; EXPECT_FAIL(s, LM_ERR_FORMAT, "block size"); /* Q4_0, ne0 = 8 */
    s = spec_default(); s.name[1] = "a"; EXPECT_FAIL(s, LM_ERR_FORMAT, "duplicate tensor");
    s = spec_default(); s.name[1] = ""; EXPECT_FAIL(s, LM_ERR_FORMAT, "empty");
    s = spec_default(); s.align_kind = 1; s.align = 0; EXPECT_FAIL(s, LM_ERR_FORMAT, "alignment");
    s = spec_default(); s.align_kind = 1; s.align = 48; EXPECT_FAIL(s, LM_ERR_FORMAT, "power of two");
    s = spec_default(); s.align_kind = 2; EXPECT_FAIL(s, LM_ERR_FORMAT, "alignment");
    s = spec_default(); s.data_bytes = 0; EXPECT_FAIL(s, LM_ERR_FORMAT, NULL);

    /* zero-length input, NULL input */
    lm_gguf *g = (lm_gguf *)1;
    CHECK(lm_gguf_open_memory(NULL, 0, &g) == LM_ERR_FORMAT && g == NULL);
    CHECK(lm_gguf_open("/nonexistent/x.gguf", &g) == LM_ERR_IO && g == NULL);
    CHECK(strstr(lm_last_error(), "/nonexistent/x.gguf") != NULL);

    /* duplicate keys, unknown value type, bad bool, too deep nesting, string arrays
     * whose count cannot fit */
    struct {
        int which;
        lm_status want;
        const char *needle;
    } cases[] = {{0, LM_ERR_FORMAT, "duplicate key"},  {1, LM_ERR_FORMAT, "unknown value type 13"},
                 {2, LM_ERR_FORMAT, "bool"},           {3, LM_ERR_LIMIT, "nested"},
                 {4, LM_ERR_FORMAT, "does not fit"},   {5, LM_ERR_FORMAT, "unknown element type"},
                 {6, LM_ERR_FORMAT, "NUL"},            {7, LM_ERR_LIMIT, "arrays of arrays"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        buf b = {0};
        put(&b, "GGUF", 4);
        put_u32(&b, 3);
        put_u64(&b, 0);
        put_u64(&b, cases[c].which == 0 ? 2 : 1);
        switch (cases[c].which) {
        case 0:
            for (int i = 0; i < 2; i++) put_str(&b, "k"), put_u32(&b, LM_GGUF_U8), put(&b, "\x01", 1);
            break;
        case 1: put_str(&b, "k"), put_u32(&b, 13), put_u32(&b, 0); break;
        case 2: put_str(&b, "k"), put_u32(&b, LM_GGUF_BOOL), put(&b, "\x02", 1); break;
        case 3:
            put_str(&b, "k"), put_u32(&b, LM_GGUF_ARRAY);
            for (int d = 0; d < 20; d++) put_u32(&b, LM_GGUF_ARRAY), put_u64(&b, 1);
            put_u32(&b, LM_GGUF_U8), put_u64(&b, 0);
            break;
        case 4:
            put_str(&b, "k"), put_u32(&b, LM_GGUF_ARRAY), put_u32(&b, LM_GGUF_STRING), put_u64(&b, 1ull << 60);
            put_u64(&b, 0);
            break;
        case 5: put_str(&b, "k"), put_u32(&b, LM_GGUF_ARRAY), put_u32(&b, 77), put_u64(&b, 0); break;
        case 6: put_u64(&b, 3), put(&b, "a\0b", 3), put_u32(&b, LM_GGUF_U8), put(&b, "\x01", 1); break;
        case 7: /* more nested elements than the limit, each an empty u8 array */
            put_str(&b, "k"), put_u32(&b, LM_GGUF_ARRAY), put_u32(&b, LM_GGUF_ARRAY);
            put_u64(&b, LM_GGUF_MAX_NESTED + 1ull);
            for (uint64_t e = 0; e <= LM_GGUF_MAX_NESTED; e++) put_u32(&b, LM_GGUF_U8), put_u64(&b, 0);
            break;
        }
        lm_status st = open_bytes(b.p, b.n, &g);
        CHECK(st == cases[c].want);
        if (st != cases[c].want || !strstr(lm_last_error(), cases[c].needle)) {
            fprintf(stderr, "  case %d: got %d: %s\n", cases[c].which, st, lm_last_error());
            if (st == cases[c].want) lm_test_failures++;
        }
        free(b.p);
    }
}

/* A hand-built version-2 file with one of each scalar type and a nested array. */
static void test_v2(void) {
    buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 2);
    put_u64(&b, 1);
    put_u64(&b, 4);
    put_str(&b, "general.architecture"), put_u32(&b, LM_GGUF_STRING), put_str(&b, "llama");
    put_str(&b, "n"), put_u32(&b, LM_GGUF_I16), put(&b, "\xfe\xff", 2); /* -2 */
    put_str(&b, "nest"), put_u32(&b, LM_GGUF_ARRAY), put_u32(&b, LM_GGUF_ARRAY), put_u64(&b, 2);
    put_u32(&b, LM_GGUF_I32), put_u64(&b, 2), put_u32(&b, 7), put_u32(&b, (uint32_t)-7);
    put_u32(&b, LM_GGUF_STRING), put_u64(&b, 1), put_str(&b, "deep");
    put_str(&b, "e"), put_u32(&b, LM_GGUF_ARRAY), put_u32(&b, LM_GGUF_F64), put_u64(&b, 0);
    put_str(&b, "w"), put_u32(&b, 1), put_u64(&b, 4), put_u32(&b, LM_DTYPE_F16), put_u64(&b, 0);
    put_pad(&b, 32);
    put(&b, "\x00\x3c\x00\x40\x00\x42\x00\x44", 8);
    lm_gguf *g = NULL;
    CHECK(lm_gguf_open_memory(b.p, b.n, &g) == LM_OK);
    if (!g) {
        fprintf(stderr, "v2: %s\n", lm_last_error());
        free(b.p);
        return;
    }
    CHECK(lm_gguf_version(g) == 2);
    const char *str;
    size_t len;
    CHECK(lm_gguf_get_str(g, "general.architecture", &str, &len) == LM_OK && len == 5 && !strcmp(str, "llama"));
    int64_t i64;
    uint32_t u32;
    CHECK(lm_gguf_get_i64(g, "n", &i64) == LM_OK && i64 == -2);
    CHECK(lm_gguf_get_u32(g, "n", &u32) == LM_ERR_FORMAT); /* negative */
    lm_gguf_type et;
    uint64_t n;
    const void *data;
    CHECK(lm_gguf_get_arr(g, "nest", &et, &n, &data) == LM_OK && et == LM_GGUF_ARRAY && n == 2 && data == NULL);
    CHECK(lm_gguf_get_arr_arr(g, "nest", 0, &et, &n, &data) == LM_OK && et == LM_GGUF_I32 && n == 2);
    int32_t iv[2];
    memcpy(iv, data, 8);
    CHECK(iv[0] == 7 && iv[1] == -7);
    CHECK(lm_gguf_get_arr_arr(g, "nest", 2, &et, &n, &data) == LM_ERR_NOT_FOUND);
    const lm_gguf_value *v = lm_gguf_kv_value(g, lm_gguf_find_key(g, "nest"));
    const lm_gguf_value *inner = lm_gguf_value_arr_item(v, 1);
    CHECK(inner && lm_gguf_value_arr_str(inner, 0, &str, &len) == LM_OK && len == 4 && !memcmp(str, "deep", 4));
    CHECK(lm_gguf_value_arr_item(v, 2) == NULL);
    CHECK(lm_gguf_get_arr(g, "e", &et, &n, &data) == LM_OK && et == LM_GGUF_F64 && n == 0);
    const lm_tensor *t = lm_gguf_find_tensor(g, "w");
    CHECK(t && t->type == LM_DTYPE_F16 && t->n_dims == 1 && t->ne[0] == 4 && t->ne[1] == 1 && t->nbytes == 8);
    CHECK(t && !memcmp(t->data, "\x00\x3c\x00\x40", 4));
    CHECK(lm_gguf_data_offset(g) % 32 == 0);
    lm_gguf_close(g);
    free(b.p);
}

static const char *tmp_path(const char *name) {
    static char path[256];
    snprintf(path, sizeof path, "/tmp/lumen_test_gguf_%d_%s", (int)getpid(), name);
    return path;
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(*n ? *n : 1);
    if (fread(p, 1, *n, f) != *n) *n = 0;
    fclose(f);
    return p;
}

static void test_round_trip(size_t align) {
    lm_gguf_writer *w = lm_gguf_writer_create();
    CHECK(w != NULL);
    if (align != 32) CHECK(lm_gguf_writer_set_u32(w, "general.alignment", (uint32_t)align) == LM_OK);
    CHECK(lm_gguf_writer_set_u8(w, "u8", 200) == LM_OK);
    CHECK(lm_gguf_writer_set_i8(w, "i8", -100) == LM_OK);
    CHECK(lm_gguf_writer_set_u16(w, "u16", 60000) == LM_OK);
    CHECK(lm_gguf_writer_set_i16(w, "i16", -30000) == LM_OK);
    CHECK(lm_gguf_writer_set_u32(w, "u32", 4000000000u) == LM_OK);
    CHECK(lm_gguf_writer_set_i32(w, "i32", -2000000000) == LM_OK);
    CHECK(lm_gguf_writer_set_u64(w, "u64", UINT64_MAX) == LM_OK);
    CHECK(lm_gguf_writer_set_i64(w, "i64", INT64_MIN) == LM_OK);
    CHECK(lm_gguf_writer_set_f32(w, "f32", 1.5f) == LM_OK);
    CHECK(lm_gguf_writer_set_f64(w, "f64", 1e300) == LM_OK);
    CHECK(lm_gguf_writer_set_bool(w, "bool", true) == LM_OK);
    CHECK(lm_gguf_writer_set_str(w, "str", "replaced") == LM_OK);
    CHECK(lm_gguf_writer_set_strn(w, "str", "h\0llo", 5) == LM_OK); /* replaces in place */
    CHECK(lm_gguf_writer_set_str(w, "empty", "") == LM_OK);
    float fa[3] = {1, 2, 3};
    CHECK(lm_gguf_writer_set_arr(w, "arr.f32", LM_GGUF_F32, fa, 3) == LM_OK);
    uint8_t ba[3] = {1, 0, 1};
    CHECK(lm_gguf_writer_set_arr(w, "arr.bool", LM_GGUF_BOOL, ba, 3) == LM_OK);
    ba[1] = 2;
    CHECK(lm_gguf_writer_set_arr(w, "arr.badbool", LM_GGUF_BOOL, ba, 3) == LM_ERR_INVALID_ARG);
    int64_t ia[2] = {-1, INT64_MAX};
    CHECK(lm_gguf_writer_set_arr(w, "arr.i64", LM_GGUF_I64, ia, 2) == LM_OK);
    CHECK(lm_gguf_writer_set_arr(w, "arr.str?", LM_GGUF_STRING, ia, 2) == LM_ERR_INVALID_ARG);
    const char *sa[] = {"a", "", "ccc"};
    CHECK(lm_gguf_writer_set_arr_str(w, "arr.str", sa, 3) == LM_OK);
    CHECK(lm_gguf_writer_set_arr_str(w, "arr.str0", NULL, 0) == LM_OK);
    /* nested: [[1,2],[3]] of u16, written raw */
    buf nb = {0};
    put_u32(&nb, LM_GGUF_ARRAY), put_u64(&nb, 2);
    put_u32(&nb, LM_GGUF_U16), put_u64(&nb, 2), put(&nb, "\x01\x00\x02\x00", 4);
    put_u32(&nb, LM_GGUF_U16), put_u64(&nb, 1), put(&nb, "\x03\x00", 2);
    CHECK(lm_gguf_writer_set_raw(w, "arr.nested", LM_GGUF_ARRAY, nb.p, nb.n) == LM_OK);
    CHECK(lm_gguf_writer_set_raw(w, "arr.bad", LM_GGUF_ARRAY, nb.p, nb.n - 1) == LM_ERR_INVALID_ARG);
    CHECK(lm_gguf_writer_set_raw(w, "", LM_GGUF_U8, "\x01", 1) == LM_ERR_INVALID_ARG);
    free(nb.p);

    /* one tensor of every GGUF type: 2 blocks per row, 3 rows */
    char names[64][16];
    void *datas[64];
    int n_t = 0;
    int types[64];
    for (int type = 0; type < 64; type++) {
        const lm_dtype_info *info = lm_dtype_get_info(type);
        if (!info) continue;
        int64_t ne[2] = {2 * info->block_size, 3};
        size_t nbytes = 3 * lm_dtype_row_bytes((lm_dtype)type, ne[0]);
        CHECK(nbytes == 3 * 2 * info->block_bytes);
        uint8_t *d = malloc(nbytes);
        for (size_t i = 0; i < nbytes; i++) d[i] = (uint8_t)(i * 7 + (size_t)type);
        snprintf(names[n_t], sizeof names[n_t], "t.%s", info->name);
        CHECK(lm_gguf_writer_add_tensor(w, names[n_t], (lm_dtype)type, 2, ne, d) == LM_OK);
        datas[n_t] = d;
        types[n_t++] = type;
    }
    CHECK(n_t >= 20);
    int64_t bad_ne[1] = {33};
    CHECK(lm_gguf_writer_add_tensor(w, "bad", LM_DTYPE_Q4_0, 1, bad_ne, datas[0]) == LM_ERR_INVALID_ARG);
    CHECK(lm_gguf_writer_add_tensor(w, names[0], LM_DTYPE_F32, 1, bad_ne, datas[0]) == LM_ERR_INVALID_ARG);
    CHECK(lm_gguf_writer_add_tensor(w, "u8", LM_DTYPE_U8, 1, bad_ne, datas[0]) == LM_ERR_INVALID_ARG);
    int64_t zero_ne[2] = {0, 5};
    CHECK(lm_gguf_writer_add_tensor(w, "empty", LM_DTYPE_F32, 2, zero_ne, NULL) == LM_OK);
    CHECK(lm_gguf_writer_add_tensor(w, "scalar", LM_DTYPE_F32, 0, NULL, fa) == LM_OK);

    const char *path = tmp_path("rt.gguf");
    CHECK(lm_gguf_writer_write(w, path) == LM_OK);
    CHECK(lm_gguf_writer_write(w, "/nonexistent/dir/x.gguf") == LM_ERR_IO);
    lm_gguf_writer_free(w);

    lm_gguf *g = NULL;
    CHECK(lm_gguf_open(path, &g) == LM_OK);
    if (!g) {
        fprintf(stderr, "round trip: %s\n", lm_last_error());
        return;
    }
    CHECK(lm_gguf_version(g) == 3);
    CHECK(lm_gguf_alignment(g) == align);
    CHECK(lm_gguf_data_offset(g) % align == 0);
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f32;
    double f64;
    bool bv;
    const char *str;
    size_t len;
    CHECK(lm_gguf_get_u32(g, "u8", &u32) == LM_OK && u32 == 200);
    CHECK(lm_gguf_get_i64(g, "i8", &i64) == LM_OK && i64 == -100);
    CHECK(lm_gguf_get_u32(g, "i8", &u32) == LM_ERR_FORMAT);
    CHECK(strstr(lm_last_error(), "'i8'") && strstr(lm_last_error(), path));
    CHECK(lm_gguf_get_u32(g, "u16", &u32) == LM_OK && u32 == 60000);
    CHECK(lm_gguf_get_i32(g, "i16", &i32) == LM_OK && i32 == -30000);
    CHECK(lm_gguf_get_u32(g, "u32", &u32) == LM_OK && u32 == 4000000000u);
    CHECK(lm_gguf_get_i32(g, "u32", &i32) == LM_ERR_FORMAT);
    CHECK(lm_gguf_get_i32(g, "i32", &i32) == LM_OK && i32 == -2000000000);
    CHECK(lm_gguf_get_u64(g, "u64", &u64) == LM_OK && u64 == UINT64_MAX);
    CHECK(lm_gguf_get_i64(g, "u64", &i64) == LM_ERR_FORMAT);
    CHECK(lm_gguf_get_u32(g, "u64", &u32) == LM_ERR_FORMAT);
    CHECK(lm_gguf_get_i64(g, "i64", &i64) == LM_OK && i64 == INT64_MIN);
    CHECK(lm_gguf_get_f32(g, "f32", &f32) == LM_OK && f32 == 1.5f);
    CHECK(lm_gguf_get_f64(g, "f32", &f64) == LM_OK && f64 == 1.5);
    CHECK(lm_gguf_get_f64(g, "f64", &f64) == LM_OK && f64 == 1e300);
    CHECK(lm_gguf_get_f32(g, "f64", &f32) == LM_ERR_FORMAT);
    CHECK(lm_gguf_get_f32(g, "u16", &f32) == LM_OK && f32 == 60000.0f);
    CHECK(lm_gguf_get_u32(g, "f32", &u32) == LM_ERR_FORMAT);
    CHECK(lm_gguf_get_bool(g, "bool", &bv) == LM_OK && bv);
    CHECK(lm_gguf_get_bool(g, "u8", &bv) == LM_ERR_FORMAT);
    CHECK(lm_gguf_get_u32(g, "bool", &u32) == LM_ERR_FORMAT);
    CHECK(lm_gguf_get_str(g, "str", &str, &len) == LM_OK && len == 5 && !memcmp(str, "h\0llo", 6));
    CHECK(lm_gguf_get_str(g, "empty", &str, &len) == LM_OK && len == 0 && str[0] == 0);
    CHECK(lm_gguf_get_str(g, "u8", &str, &len) == LM_ERR_FORMAT);
    CHECK(lm_gguf_get_u32(g, "absent", &u32) == LM_ERR_NOT_FOUND);
    CHECK(strstr(lm_last_error(), "absent") != NULL);
    CHECK(lm_gguf_find_key(g, "absent") == -1);
    CHECK(lm_gguf_kv_key(g, -1) == NULL && lm_gguf_kv_key(g, lm_gguf_n_kv(g)) == NULL);
    /* key order is first-set order */
    int64_t first = align != 32 ? 1 : 0;
    CHECK(!strcmp(lm_gguf_kv_key(g, first), "u8") && lm_gguf_kv_type(g, first) == LM_GGUF_U8);
    CHECK(lm_gguf_kv_type(g, lm_gguf_find_key(g, "str")) == LM_GGUF_STRING);

    lm_gguf_type et;
    uint64_t n;
    const void *data;
    CHECK(lm_gguf_get_arr(g, "arr.f32", &et, &n, &data) == LM_OK && et == LM_GGUF_F32 && n == 3 &&
          !memcmp(data, fa, sizeof fa));
    CHECK(lm_gguf_get_arr(g, "arr.bool", &et, &n, &data) == LM_OK && et == LM_GGUF_BOOL && n == 3 &&
          !memcmp(data, "\x01\x00\x01", 3));
    CHECK(lm_gguf_get_arr(g, "arr.i64", &et, &n, &data) == LM_OK && et == LM_GGUF_I64 && n == 2 &&
          !memcmp(data, ia, sizeof ia));
    CHECK(lm_gguf_get_arr(g, "u8", &et, &n, &data) == LM_ERR_FORMAT);
    CHECK(lm_gguf_get_arr(g, "arr.str", &et, &n, &data) == LM_OK && et == LM_GGUF_STRING && n == 3 && !data);
    for (uint64_t i = 0; i < 3; i++)
        CHECK(lm_gguf_get_arr_str(g, "arr.str", i, &str, &len) == LM_OK && len == strlen(sa[i]) &&
              !memcmp(str, sa[i], len));
    CHECK(lm_gguf_get_arr_str(g, "arr.str", 3, &str, &len) == LM_ERR_NOT_FOUND);
    CHECK(lm_gguf_get_arr_str(g, "arr.f32", 0, &str, &len) == LM_ERR_FORMAT);
    CHECK(lm_gguf_get_arr(g, "arr.str0", &et, &n, &data) == LM_OK && et == LM_GGUF_STRING && n == 0);
    CHECK(lm_gguf_get_arr_arr(g, "arr.nested", 0, &et, &n, &data) == LM_OK && et == LM_GGUF_U16 && n == 2 &&
          !memcmp(data, "\x01\x00\x02\x00", 4));
    CHECK(lm_gguf_get_arr_arr(g, "arr.nested", 1, &et, &n, &data) == LM_OK && n == 1);
    CHECK(lm_gguf_get_arr_arr(g, "arr.str", 0, &et, &n, &data) == LM_ERR_FORMAT);

    /* raw copy of a value into a new writer reproduces it */
    lm_gguf_type rt;
    const void *raw;
    size_t raw_size;
    CHECK(lm_gguf_kv_raw(g, lm_gguf_find_key(g, "arr.nested"), &rt, &raw, &raw_size) == LM_OK &&
          rt == LM_GGUF_ARRAY && raw_size == 12 + 12 + 4 + 12 + 2);

    CHECK(lm_gguf_n_tensors(g) == n_t + 2);
    const lm_tensor *first_t = lm_gguf_tensor(g, 0);
    for (int i = 0; i < n_t; i++) {
        const lm_tensor *t = lm_gguf_find_tensor(g, names[i]);
        CHECK(t == lm_gguf_tensor(g, i));
        if (!t) continue;
        const lm_dtype_info *info = lm_dtype_get_info(types[i]);
        CHECK((int)t->type == types[i] && t->n_dims == 2 && t->ne[0] == 2 * info->block_size && t->ne[1] == 3 &&
              t->ne[2] == 1 && t->ne[3] == 1);
        CHECK(t->nbytes == 6 * info->block_bytes && !memcmp(t->data, datas[i], t->nbytes));
        CHECK(((const uint8_t *)t->data - (const uint8_t *)first_t->data) % align == 0);
        CHECK((size_t)((uintptr_t)t->data % align) == 0); /* mmap is page-aligned */
        CHECK(!strcmp(t->name, names[i]));
    }
    const lm_tensor *e = lm_gguf_find_tensor(g, "empty");
    CHECK(e && e->nbytes == 0 && e->ne[0] == 0 && e->ne[1] == 5);
    const lm_tensor *sc = lm_gguf_find_tensor(g, "scalar");
    CHECK(sc && sc->n_dims == 0 && sc->nbytes == 4 && !memcmp(sc->data, fa, 4));
    CHECK(lm_gguf_find_tensor(g, "nope") == NULL && lm_gguf_tensor(g, -1) == NULL);
    lm_gguf_close(g);
    for (int i = 0; i < n_t; i++) free(datas[i]);
    unlink(path);
}

/* Every proper prefix of a valid file must fail cleanly; the full file must open. */
static void test_truncation(void) {
    lm_gguf_writer *w = lm_gguf_writer_create();
    lm_gguf_writer_set_str(w, "general.architecture", "llama");
    const char *sa[] = {"x", "yy"};
    lm_gguf_writer_set_arr_str(w, "toks", sa, 2);
    lm_gguf_writer_set_bool(w, "b", false);
    buf nb = {0};
    put_u32(&nb, LM_GGUF_ARRAY), put_u64(&nb, 1), put_u32(&nb, LM_GGUF_I8), put_u64(&nb, 1), put(&nb, "\x05", 1);
    lm_gguf_writer_set_raw(w, "nest", LM_GGUF_ARRAY, nb.p, nb.n);
    free(nb.p);
    float d[40];
    for (int i = 0; i < 40; i++) d[i] = (float)i;
    /* b's 32 bytes end on the alignment, so the file has no trailing padding and
     * every shorter prefix lacks real bytes */
    int64_t ne1[1] = {5}, ne2[2] = {4, 2};
    lm_gguf_writer_add_tensor(w, "a", LM_DTYPE_F32, 1, ne1, d);
    lm_gguf_writer_add_tensor(w, "b", LM_DTYPE_F32, 2, ne2, d + 8);
    const char *path = tmp_path("trunc.gguf");
    CHECK(lm_gguf_writer_write(w, path) == LM_OK);
    lm_gguf_writer_free(w);
    size_t n = 0;
    uint8_t *all = read_all(path, &n);
    unlink(path);
    CHECK(all && n > 100);
    int bad = 0;
    for (size_t len = 0; len <= n; len++) {
        lm_gguf *g = NULL;
        lm_status st = open_bytes(all, len, &g);
        if (len < n && (st == LM_OK || g != NULL || !lm_last_error()[0])) bad++, fprintf(stderr, "prefix %zu opened\n", len);
        if (len == n && st != LM_OK) bad++, fprintf(stderr, "full file: %s\n", lm_last_error());
    }
    CHECK(bad == 0);
    /* every single-byte corruption must either open or fail cleanly (ASan checks) */
    for (size_t i = 0; i < n; i++) {
        uint8_t saved = all[i];
        for (int v = 0; v < 3; v++) {
            static const uint8_t vals[3] = {0x00, 0xff, 0x80};
            all[i] = vals[v];
            lm_gguf *g = NULL;
            (void)open_bytes(all, n, &g);
        }
        all[i] = saved;
    }
    free(all);
}

int main(void) {
    test_spec_valid();
    test_bad_inputs();
    test_v2();
    test_round_trip(32);
    test_round_trip(64);
    test_truncation();
    TEST_MAIN_END();
}
