/* safetensors reader/writer and model folders: round trips, hand-written headers
 * with one defect each, every-prefix truncation, and sharded-index failures. */
#include "formats/safetensors.h"
#include "test.h"

#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    return path;
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(p, 1, n, f);
    fclose(f);
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

/* Opens an exact-size heap copy (ASan catches over-reads), then closes it. */
static lm_status open_bytes(const void *p, size_t n) {
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, p, n);
    lm_safetensors *st = NULL;
    lm_status s = lm_safetensors_open_memory(n ? copy : NULL, n, &st);
    if (s != LM_OK && st != NULL) lm_test_failures++;
    lm_safetensors_close(st);
    free(copy);
    return s;
}

/* A file from a header string and `data_len` data bytes. */
static lm_status open_header(const char *json, size_t data_len) {
    size_t h = strlen(json), n = 8 + h + data_len;
    uint8_t *b = calloc(1, n);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, json, h);
    lm_status s = open_bytes(b, n);
    free(b);
    return s;
}

static void expect(const char *json, size_t data_len, lm_status want, const char *needle, int line) {
    lm_status s = open_header(json, data_len);
    if (s != want) {
        fprintf(stderr, "line %d: want %d got %d: %s\n", line, want, s, lm_last_error());
        lm_test_failures++;
    } else if (needle && !strstr(lm_last_error(), needle)) {
        fprintf(stderr, "line %d: message lacks '%s': %s\n", line, needle, lm_last_error());
        lm_test_failures++;
    }
}
#define EXPECT(json, data_len, want, needle) expect((json), (data_len), (want), (needle), __LINE__)

static void test_headers(void) {
    EXPECT("{}", 0, LM_OK, NULL);
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}   ", 24, LM_OK, NULL);
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, LM_OK, NULL);
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
           "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, LM_OK, NULL);
    /* defects */
    EXPECT("not json at all", 0, LM_ERR_FORMAT, "JSON");
    EXPECT("{\"a\":", 0, LM_ERR_FORMAT, "JSON");
    EXPECT("[1,2]", 0, LM_ERR_FORMAT, "JSON object");
    EXPECT("{} x", 0, LM_ERR_FORMAT, "after the JSON");
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24, LM_ERR_FORMAT, "needs 24");
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 23, LM_ERR_FORMAT, "outside");
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,4]}}", 24, LM_ERR_FORMAT, "outside");
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 24, LM_ERR_FORMAT, "data_offsets");
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 24, LM_ERR_FORMAT, "data_offsets");
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]}}", 24, LM_ERR_FORMAT, "data_offsets");
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]}}", 24, LM_ERR_FORMAT, "data_offsets");
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, LM_ERR_FORMAT, "overlap");
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, LM_ERR_FORMAT, "duplicate");
    EXPECT("{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, LM_ERR_UNSUPPORTED, "F8_E4M3");
    EXPECT("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,2]}}", 2, LM_ERR_FORMAT, "dtype");
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, LM_ERR_UNSUPPORTED,
           "5 dimensions");
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, LM_ERR_FORMAT, "shape[0]");
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,4]}}", 4, LM_ERR_FORMAT, "shape[0]");
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, LM_ERR_FORMAT,
           "overflow");
    EXPECT("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,536870912],\"data_offsets\":[0,4]}}", 4, LM_ERR_FORMAT,
           NULL);
    EXPECT("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, LM_ERR_FORMAT, "shape");
    EXPECT("{\"a\":[1,2]}", 4, LM_ERR_FORMAT, "'a'");
    EXPECT("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, LM_ERR_FORMAT, "empty name");
    EXPECT("{\"__metadata__\":{\"k\":1}}", 0, LM_ERR_FORMAT, "not a string");
    EXPECT("{\"__metadata__\":[]}", 0, LM_ERR_FORMAT, "__metadata__");
    EXPECT("{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0, LM_ERR_FORMAT, "duplicate");

    /* header length beyond the file, absurd, too short a file */
    uint8_t b[16] = {0};
    b[0] = 100;
    memcpy(b + 8, "{}      ", 8);
    CHECK(open_bytes(b, 16) == LM_ERR_FORMAT && strstr(lm_last_error(), "past the end"));
    memset(b, 0xff, 8);
    CHECK(open_bytes(b, 16) == LM_ERR_LIMIT);
    CHECK(open_bytes(b, 7) == LM_ERR_FORMAT);
    CHECK(open_bytes(NULL, 0) == LM_ERR_FORMAT);
    lm_safetensors *st = (lm_safetensors *)1;
    CHECK(lm_safetensors_open("/nonexistent/m.safetensors", &st) == LM_ERR_IO && st == NULL);
}

static const lm_dtype all_types[] = {LM_DTYPE_F64, LM_DTYPE_F32, LM_DTYPE_F16, LM_DTYPE_BF16, LM_DTYPE_I64,
                                     LM_DTYPE_I32, LM_DTYPE_I16, LM_DTYPE_I8,  LM_DTYPE_U64,  LM_DTYPE_U32,
                                     LM_DTYPE_U16, LM_DTYPE_U8,  LM_DTYPE_BOOL};
static const size_t all_sizes[] = {8, 4, 2, 2, 8, 4, 2, 1, 8, 4, 2, 1, 1};
enum { N_TYPES = sizeof all_types / sizeof all_types[0] };

static void test_round_trip(void) {
    lm_safetensors_writer *w = lm_safetensors_writer_create();
    CHECK(lm_safetensors_writer_set_metadata(w, "format", "np") == LM_OK);
    CHECK(lm_safetensors_writer_set_metadata(w, "format", "pt") == LM_OK);
    CHECK(lm_safetensors_writer_set_metadata(w, "quote\"d", "va\nl") == LM_OK);
    uint8_t pattern[4 * 3 * 2 * 8];
    for (size_t i = 0; i < sizeof pattern; i++) pattern[i] = (uint8_t)(i * 13 + 1);
    for (size_t i = 0; i < N_TYPES; i++) if (all_types[i] == LM_DTYPE_BOOL) pattern[0] = 1;
    char names[N_TYPES][32];
    for (int i = 0; i < N_TYPES; i++) {
        snprintf(names[i], sizeof names[i], "layer.%d.w\"eight", i);
        int64_t shape[3] = {4, 3, 2};
        CHECK(lm_safetensors_writer_add(w, names[i], all_types[i], 3, shape, pattern) == LM_OK);
    }
    int64_t shape4[4] = {1, 2, 1, 3}, shape0[1] = {0}, shape5[5] = {1, 1, 1, 1, 1};
    CHECK(lm_safetensors_writer_add(w, "four", LM_DTYPE_F32, 4, shape4, pattern) == LM_OK);
    CHECK(lm_safetensors_writer_add(w, "scalar", LM_DTYPE_F32, 0, NULL, pattern) == LM_OK);
    CHECK(lm_safetensors_writer_add(w, "empty", LM_DTYPE_F32, 1, shape0, NULL) == LM_OK);
    CHECK(lm_safetensors_writer_add(w, "five", LM_DTYPE_F32, 5, shape5, pattern) == LM_ERR_INVALID_ARG);
    CHECK(lm_safetensors_writer_add(w, "q", LM_DTYPE_Q4_0, 1, shape4, pattern) == LM_ERR_INVALID_ARG);
    CHECK(lm_safetensors_writer_add(w, "four", LM_DTYPE_F32, 1, shape4, pattern) == LM_ERR_INVALID_ARG);
    CHECK(lm_safetensors_writer_add(w, "__metadata__", LM_DTYPE_F32, 1, shape4, pattern) == LM_ERR_INVALID_ARG);
    const char *path = tmp_path("rt.safetensors");
    CHECK(lm_safetensors_writer_write(w, path) == LM_OK);
    CHECK(lm_safetensors_writer_write(w, "/nonexistent/dir/x.safetensors") == LM_ERR_IO);
    lm_safetensors_writer_free(w);

    size_t n = 0;
    uint8_t *all = read_all(path, &n);
    CHECK(all && n > 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | all[i];
    CHECK((8 + hlen) % 8 == 0 && all[8] == '{');

    lm_safetensors *st = NULL;
    CHECK(lm_safetensors_open(path, &st) == LM_OK);
    if (!st) {
        fprintf(stderr, "%s\n", lm_last_error());
        free(all);
        return;
    }
    CHECK(lm_safetensors_n_tensors(st) == N_TYPES + 3);
    CHECK(!strcmp(lm_safetensors_metadata(st, "format"), "pt"));
    CHECK(!strcmp(lm_safetensors_metadata(st, "quote\"d"), "va\nl"));
    CHECK(lm_safetensors_metadata(st, "absent") == NULL);
    CHECK(lm_safetensors_n_metadata(st) == 2 && lm_safetensors_metadata_key(st, 2) == NULL);
    for (int i = 0; i < N_TYPES; i++) {
        const lm_tensor *t = lm_safetensors_find_tensor(st, names[i]);
        CHECK(t != NULL);
        if (!t) continue;
        CHECK(t->type == all_types[i] && t->n_dims == 3 && t->ne[0] == 2 && t->ne[1] == 3 && t->ne[2] == 4 &&
              t->ne[3] == 1);
        CHECK(t->nbytes == 24 * all_sizes[i] && !memcmp(t->data, pattern, t->nbytes));
        CHECK(!strcmp(t->name, names[i]));
    }
    const lm_tensor *t4 = lm_safetensors_find_tensor(st, "four");
    CHECK(t4 && t4->n_dims == 4 && t4->ne[0] == 3 && t4->ne[1] == 1 && t4->ne[2] == 2 && t4->ne[3] == 1);
    const lm_tensor *t0 = lm_safetensors_find_tensor(st, "scalar");
    CHECK(t0 && t0->n_dims == 0 && t0->nbytes == 4 && t0->ne[0] == 1);
    const lm_tensor *te = lm_safetensors_find_tensor(st, "empty");
    CHECK(te && te->nbytes == 0 && te->ne[0] == 0);
    /* tensor order is data order; data is contiguous */
    for (int64_t i = 1; i < lm_safetensors_n_tensors(st); i++)
        CHECK((const uint8_t *)lm_safetensors_tensor(st, i)->data >=
              (const uint8_t *)lm_safetensors_tensor(st, i - 1)->data + lm_safetensors_tensor(st, i - 1)->nbytes);
    CHECK(lm_safetensors_tensor(st, -1) == NULL && lm_safetensors_find_tensor(st, "x") == NULL);
    lm_safetensors_close(st);

    /* every proper prefix fails cleanly */
    int bad = 0;
    for (size_t len = 0; len < n; len++) {
        lm_status s = open_bytes(all, len);
        if (s == LM_OK || !lm_last_error()[0]) bad++, fprintf(stderr, "prefix %zu opened\n", len);
    }
    CHECK(bad == 0);
    CHECK(open_bytes(all, n) == LM_OK);
    free(all);
    unlink(path);
}

static void write_st(const char *file, const char *const *names, int n) {
    lm_safetensors_writer *w = lm_safetensors_writer_create();
    float v[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    for (int i = 0; i < n; i++) lm_safetensors_writer_add(w, names[i], LM_DTYPE_F32, 1, shape, v);
    CHECK(lm_safetensors_writer_write(w, tmp_path(file)) == LM_OK);
    lm_safetensors_writer_free(w);
}

static void write_index(const char *json) { write_file(tmp_path("model.safetensors.index.json"), json, strlen(json)); }

static void expect_folder(lm_status want, const char *needle, int line) {
    lm_st_folder *f = NULL;
    lm_status s = lm_st_folder_open(tmpdir, &f);
    if (s != want || (needle && !strstr(lm_last_error(), needle))) {
        fprintf(stderr, "line %d: want %d got %d: %s\n", line, want, s, lm_last_error());
        lm_test_failures++;
    }
    if (s != LM_OK && f) lm_test_failures++;
    lm_st_folder_close(f);
}
#define EXPECT_FOLDER(want, needle) expect_folder((want), (needle), __LINE__)

static void test_folder(void) {
    EXPECT_FOLDER(LM_ERR_NOT_FOUND, "model.safetensors");
    const char *single[] = {"x", "y"};
    write_st("model.safetensors", single, 2);
    lm_st_folder *f = NULL;
    CHECK(lm_st_folder_open(tmpdir, &f) == LM_OK);
    CHECK(f && lm_st_folder_n_tensors(f) == 2 && lm_st_folder_n_shards(f) == 1);
    CHECK(f && lm_st_folder_find_tensor(f, "y") && lm_st_folder_find_tensor(f, "z") == NULL);
    lm_st_folder_close(f);

    const char *s1[] = {"a", "b"}, *s2[] = {"c"};
    write_st("model-00001-of-00002.safetensors", s1, 2);
    write_st("model-00002-of-00002.safetensors", s2, 1);
    write_index("{\"metadata\":{\"total_size\":48},\"weight_map\":{"
                "\"a\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\","
                "\"b\":\"model-00001-of-00002.safetensors\"}}");
    f = NULL;
    CHECK(lm_st_folder_open(tmpdir, &f) == LM_OK); /* the index wins over model.safetensors */
    if (f) {
        CHECK(lm_st_folder_n_tensors(f) == 3 && lm_st_folder_n_shards(f) == 2);
        CHECK(!strcmp(lm_st_folder_tensor(f, 1)->name, "c"));
        const lm_tensor *b = lm_st_folder_find_tensor(f, "b");
        CHECK(b && b->nbytes == 16 && ((const float *)b->data)[3] == 4.0f);
        CHECK(lm_st_folder_find_tensor(f, "x") == NULL && lm_st_folder_tensor(f, 3) == NULL);
    } else {
        fprintf(stderr, "%s\n", lm_last_error());
    }
    lm_st_folder_close(f);

    write_index("{\"weight_map\":{\"a\":\"model-00009-of-00009.safetensors\"}}");
    EXPECT_FOLDER(LM_ERR_IO, "model-00009-of-00009.safetensors");
    write_index("{\"weight_map\":{\"a\":\"../model-00001-of-00002.safetensors\"}}");
    EXPECT_FOLDER(LM_ERR_FORMAT, "not a plain file name");
    write_index("{\"weight_map\":{\"a\":\"/etc/passwd\"}}");
    EXPECT_FOLDER(LM_ERR_FORMAT, "not a plain file name");
    write_index("{\"weight_map\":{\"a\":\"..\"}}");
    EXPECT_FOLDER(LM_ERR_FORMAT, "not a plain file name");
    write_index("{\"weight_map\":{\"a\":\"sub\\\\x.safetensors\"}}");
    EXPECT_FOLDER(LM_ERR_FORMAT, "not a plain file name");
    write_index("{\"weight_map\":{\"zz\":\"model-00001-of-00002.safetensors\"}}");
    EXPECT_FOLDER(LM_ERR_FORMAT, "lacks it");
    write_index("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"a\":\"model-00001-of-00002.safetensors\"}}");
    EXPECT_FOLDER(LM_ERR_FORMAT, "twice");
    write_index("{\"weight_map\":{\"a\":3}}");
    EXPECT_FOLDER(LM_ERR_FORMAT, "not a string");
    write_index("{\"weight_map\":[]}");
    EXPECT_FOLDER(LM_ERR_FORMAT, "weight_map");
    write_index("{\"weight");
    EXPECT_FOLDER(LM_ERR_FORMAT, "JSON");
    write_index("");
    EXPECT_FOLDER(LM_ERR_FORMAT, "JSON");
    /* a corrupt shard is reported with the index's context */
    write_file(tmp_path("bad.safetensors"), "\x02\0\0\0\0\0\0\0{}", 10);
    write_file(tmp_path("bad2.safetensors"), "\x05\0\0\0\0\0\0\0{}", 10);
    write_index("{\"weight_map\":{\"a\":\"bad2.safetensors\"}}");
    EXPECT_FOLDER(LM_ERR_FORMAT, "bad2.safetensors");
    write_index("{\"weight_map\":{\"a\":\"bad.safetensors\"}}");
    EXPECT_FOLDER(LM_ERR_FORMAT, "lacks it");

    const char *files[] = {"model.safetensors.index.json", "model.safetensors", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors", "bad.safetensors", "bad2.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) unlink(tmp_path(files[i]));
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lumen_test_st_%d", (int)getpid());
    mkdir(tmpdir, 0700);
    test_headers();
    test_round_trip();
    test_folder();
    rmdir(tmpdir);
    TEST_MAIN_END();
}
