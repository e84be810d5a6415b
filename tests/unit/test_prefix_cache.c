/* The paged KV cache's sharing (attach, reference counts, copy-on-write) and the
 * prefix cache (radix tree over blocks, partial blocks, LRU eviction by bytes,
 * hit/miss counters), then on tiny random models: a prompt whose prefix comes from
 * the cache gives logits bit-identical to the same prompt computed from scratch,
 * both when the shared part ends on a block boundary and when it ends inside a
 * block (copy-on-write), with F16 and F32 caches. */
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "kv/prefix_cache.h"
#include "model/forward.h"
#include "test.h"
#include "tiny_model.h"

static char g_dir[256];

/* writes a distinct value into every element of a block (F32 cache) */
static void fill_block(lm_kv_cache *kv, int32_t b, float base) {
    float *k = kv->k, *v = kv->v;
    for (int64_t l = 0; l < kv->n_layer; l++)
        for (int64_t i = 0; i < kv->block_size * kv->n_embd_kv; i++) {
            size_t off = (size_t)((l * kv->n_blocks + b) * kv->block_size * kv->n_embd_kv + i);
            k[off] = base + (float)i;
            v[off] = -base - (float)i;
        }
}

static bool block_equals(lm_kv_cache *kv, int32_t a, int32_t b) {
    const float *k = kv->k, *v = kv->v;
    size_t row = (size_t)(kv->block_size * kv->n_embd_kv);
    for (int64_t l = 0; l < kv->n_layer; l++) {
        size_t oa = (size_t)(l * kv->n_blocks + a) * row, ob = (size_t)(l * kv->n_blocks + b) * row;
        if (memcmp(k + oa, k + ob, row * sizeof(float)) || memcmp(v + oa, v + ob, row * sizeof(float))) return false;
    }
    return true;
}

static void test_sharing(lm_backend *b) {
    lm_kv_cache *kv;
    CHECK(lm_kv_cache_create(b, 2, 4, 16, 8, 4, LM_DTYPE_F32, &kv) == LM_OK);
    CHECK(lm_kv_cache_reserve(kv, 0, 40) == LM_OK); /* 3 blocks */
    CHECK(kv->n_free == 5);
    for (int i = 0; i < 3; i++) fill_block(kv, kv->seqs[0].blocks[i], 100.0f * (float)(i + 1));
    int32_t shared[3];
    memcpy(shared, kv->seqs[0].blocks, sizeof shared);

    /* attach: the blocks get a second reference, nothing is taken from the pool */
    CHECK(lm_kv_cache_attach(kv, 1, shared, 3, 40) == LM_OK);
    CHECK(kv->n_free == 5);
    for (int i = 0; i < 3; i++) CHECK(kv->refcount[shared[i]] == 2);
    CHECK(lm_kv_cache_attach(kv, 1, shared, 3, 40) == LM_ERR_INVALID_ARG); /* not empty */
    CHECK(lm_kv_cache_attach(kv, 2, shared, 3, 10) == LM_ERR_INVALID_ARG); /* does not fit */

    /* writing position 40 of seq 1 needs a private copy of the third block */
    CHECK(lm_kv_cache_blocks_needed(kv, 1, 41) == 1);
    CHECK(lm_kv_cache_blocks_needed(kv, 1, 49) == 2);
    CHECK(lm_kv_cache_cow(kv, 1, 40) == LM_OK);
    CHECK(kv->seqs[1].blocks[2] != shared[2]);
    CHECK(kv->refcount[shared[2]] == 1 && kv->refcount[kv->seqs[1].blocks[2]] == 1);
    CHECK(block_equals(kv, shared[2], kv->seqs[1].blocks[2]));
    CHECK(kv->n_free == 4);
    CHECK(lm_kv_cache_cow(kv, 1, 40) == LM_OK); /* private now: no second copy */
    CHECK(kv->n_free == 4);
    CHECK(lm_kv_cache_cow(kv, 1, 5) == LM_OK && kv->seqs[1].blocks[0] != shared[0]); /* any shared block */

    /* truncating drops references; blocks return when the last holder lets go */
    lm_kv_cache_truncate(kv, 0, 0);
    CHECK(kv->refcount[shared[1]] == 1);
    lm_kv_cache_truncate(kv, 1, 0);
    CHECK(kv->n_free == 8);
    for (int i = 0; i < 8; i++) CHECK(kv->refcount[i] == 0);

    /* a pool with no free block: copy-on-write fails and changes nothing */
    CHECK(lm_kv_cache_reserve(kv, 0, 16 * 8) == LM_OK);
    CHECK(lm_kv_cache_attach(kv, 1, kv->seqs[0].blocks, 8, 16 * 8) == LM_OK);
    CHECK(lm_kv_cache_cow(kv, 1, 3) == LM_ERR_NO_MEMORY);
    CHECK(kv->seqs[1].blocks[0] == kv->seqs[0].blocks[0]);
    lm_kv_cache_free(kv);
}

static void tokens_of(int32_t *t, int n, int salt) {
    for (int i = 0; i < n; i++) t[i] = (i * 7 + salt) % 50;
}

static void test_tree(lm_backend *b) {
    lm_kv_cache *kv;
    CHECK(lm_kv_cache_create(b, 1, 4, 16, 16, 4, LM_DTYPE_F32, &kv) == LM_OK);
    lm_prefix_cache *pc;
    CHECK(lm_prefix_cache_create(kv, 0, &pc) == LM_OK);
    int32_t a[70], blocks[8];
    int64_t nb = 0;
    tokens_of(a, 70, 1);

    /* empty tree: a miss */
    CHECK(lm_prefix_cache_match(pc, a, 70, 69, blocks, &nb) == 0 && nb == 0);
    lm_prefix_cache_record(pc, 70, 0);

    /* a finished sequence of 50 tokens: 3 full blocks and a partial one */
    CHECK(lm_kv_cache_reserve(kv, 0, 50) == LM_OK);
    int32_t sb[4];
    memcpy(sb, kv->seqs[0].blocks, sizeof sb);
    CHECK(lm_prefix_cache_insert(pc, a, 50, sb, true) == LM_OK);
    lm_kv_cache_truncate(kv, 0, 0);
    for (int i = 0; i < 4; i++) CHECK(kv->refcount[sb[i]] == 1); /* the tree's */
    CHECK(kv->n_free == 12);
    CHECK(lm_prefix_cache_evictable(pc) == 4);

    /* the same prompt, longer: all 50 tokens, 4 blocks */
    CHECK(lm_prefix_cache_match(pc, a, 70, 69, blocks, &nb) == 50 && nb == 4);
    CHECK(memcmp(blocks, sb, sizeof sb) == 0);
    /* at most max_match: 40 = two full blocks and 8 tokens of the third */
    CHECK(lm_prefix_cache_match(pc, a, 70, 40, blocks, &nb) == 40 && nb == 3);
    /* a prompt diverging at token 20: one full block and 4 tokens of the second */
    int32_t c[70];
    memcpy(c, a, sizeof c);
    c[20] = 99;
    CHECK(lm_prefix_cache_match(pc, c, 70, 69, blocks, &nb) == 20 && nb == 2 && blocks[1] == sb[1]);
    lm_prefix_cache_record(pc, 70, 20);
    lm_prefix_cache_stats st;
    lm_prefix_cache_get_stats(pc, &st);
    CHECK(st.lookups == 2 && st.hits == 1 && st.misses == 1 && st.hit_tokens == 20 && st.lookup_tokens == 140);
    CHECK(st.n_nodes == 4 && st.bytes == 4 * lm_kv_cache_block_bytes(kv));

    /* a second branch (diverging in block 2): shares block 0 and 1, adds its own */
    int32_t d[48];
    memcpy(d, a, sizeof d);
    d[40] = 98;
    CHECK(lm_kv_cache_reserve(kv, 1, 48) == LM_OK);
    int32_t db[3];
    memcpy(db, kv->seqs[1].blocks, sizeof db);
    CHECK(lm_prefix_cache_insert(pc, d, 48, db, true) == LM_OK);
    lm_prefix_cache_get_stats(pc, &st);
    CHECK(st.n_nodes == 5); /* only the new third block was taken */
    CHECK(kv->refcount[db[0]] == 1 && kv->refcount[db[2]] == 2);
    lm_kv_cache_truncate(kv, 1, 0);
    CHECK(lm_prefix_cache_match(pc, d, 48, 48, blocks, &nb) == 48 && nb == 3 && blocks[2] == db[2]);

    /* a block in use by a sequence is not evictable, nor are its ancestors */
    CHECK(lm_kv_cache_attach(kv, 2, blocks, 3, 48) == LM_OK);
    CHECK(lm_prefix_cache_evictable(pc) == 2); /* a's third and fourth blocks */
    /* LRU: d's branch was used last, so a's leaf (block 3) goes first */
    CHECK(lm_prefix_cache_evict(pc, kv->n_free + 1) == 1);
    CHECK(kv->refcount[sb[3]] == 0);
    CHECK(lm_prefix_cache_evict(pc, 16) == 1); /* then a's third; the rest is pinned */
    lm_prefix_cache_get_stats(pc, &st);
    CHECK(st.n_nodes == 3 && st.evictions == 2);
    lm_kv_cache_truncate(kv, 2, 0);
    CHECK(lm_prefix_cache_evictable(pc) == 3);
    lm_prefix_cache_clear(pc);
    CHECK(kv->n_free == 16);
    lm_prefix_cache_free(pc);

    /* a byte budget of two blocks: inserting four keeps the first two (leaves go) */
    CHECK(lm_prefix_cache_create(kv, 2 * lm_kv_cache_block_bytes(kv), &pc) == LM_OK);
    CHECK(lm_kv_cache_reserve(kv, 0, 64) == LM_OK);
    CHECK(lm_prefix_cache_insert(pc, a, 64, kv->seqs[0].blocks, true) == LM_OK);
    lm_prefix_cache_get_stats(pc, &st);
    CHECK(st.n_nodes == 4); /* all still in use by sequence 0 */
    lm_kv_cache_truncate(kv, 0, 0);
    CHECK(lm_prefix_cache_insert(pc, a, 0, NULL, false) == LM_OK); /* any insert enforces the budget */
    lm_prefix_cache_get_stats(pc, &st);
    CHECK(st.n_nodes == 2 && st.bytes <= st.max_bytes);
    CHECK(lm_prefix_cache_match(pc, a, 64, 64, blocks, &nb) == 32);
    lm_prefix_cache_free(pc);
    CHECK(kv->n_free == 16);
    lm_kv_cache_free(kv);
}

/* logits of the last token of tok[0..n) computed from scratch in `seq` */
static void from_scratch(lm_model_internal *m, lm_kv_cache *kv, int32_t seq, const int32_t *tok, int n, float *out) {
    int32_t pos[128], sq[128];
    for (int i = 0; i < n; i++) pos[i] = i, sq[i] = seq;
    lm_batch bt = {n, tok, pos, sq, NULL};
    CHECK(lm_forward(m, kv, &bt, out) == LM_OK);
}

static void test_hit_equals_miss(lm_backend *b, lm_arch arch, lm_dtype kv_type) {
    char path[512];
    snprintf(path, sizeof path, "%s/m%d.gguf", g_dir, (int)arch);
    tiny_model tm;
    tiny_build(&tm, tiny_default(arch));
    CHECK(tiny_write_gguf(&tm, path, NULL) == LM_OK);
    tiny_free(&tm);
    lm_model_internal *m = NULL;
    CHECK(lm_model_internal_load(path, b, &m) == LM_OK);
    if (!m) return;
    int64_t V = m->hp.n_vocab;
    lm_kv_cache *kv;
    CHECK(lm_kv_cache_for_model(m, 128, 4, kv_type, &kv) == LM_OK);
    lm_prefix_cache *pc;
    CHECK(lm_prefix_cache_create(kv, 0, &pc) == LM_OK);
    float *miss = malloc(sizeof(float) * (size_t)V), *hit = malloc(sizeof(float) * (size_t)V);

    /* a "system prompt" of 45 tokens computed once, kept in the tree */
    int32_t sys[45];
    for (int i = 0; i < 45; i++) sys[i] = (int32_t)((i * 13 + 3) % V);
    from_scratch(m, kv, 0, sys, 45, miss);
    CHECK(lm_prefix_cache_insert(pc, sys, 45, kv->seqs[0].blocks, true) == LM_OK);
    lm_kv_cache_truncate(kv, 0, 0);

    for (int split = 0; split < 3; split++) {
        /* a prompt that continues it (split 0), shares only 32 tokens (block
         * boundary, split 1) or 37 (inside a block, split 2) */
        int32_t p[80];
        memcpy(p, sys, sizeof sys);
        for (int i = 45; i < 80; i++) p[i] = (int32_t)((i * 5 + 1) % V);
        if (split == 1) p[32] = (p[32] + 1) % (int32_t)V;
        if (split == 2) p[37] = (p[37] + 1) % (int32_t)V;
        from_scratch(m, kv, 1, p, 80, miss);
        lm_kv_cache_truncate(kv, 1, 0);

        int32_t blocks[16];
        int64_t nb;
        int64_t got = lm_prefix_cache_match(pc, p, 80, 79, blocks, &nb);
        CHECK(got == (split == 0 ? 45 : split == 1 ? 32 : 37));
        CHECK(lm_kv_cache_attach(kv, 2, blocks, nb, got) == LM_OK);
        CHECK(lm_kv_cache_cow(kv, 2, got) == LM_OK);
        int32_t pos[80], sq[80];
        for (int i = 0; i < 80; i++) pos[i] = i, sq[i] = 2;
        lm_batch bt = {80 - got, p + got, pos + got, sq, NULL};
        CHECK(lm_forward(m, kv, &bt, hit) == LM_OK);
        CHECK(memcmp(hit, miss, sizeof(float) * (size_t)V) == 0);
        lm_kv_cache_truncate(kv, 2, 0);

        /* the shared blocks were not written: the system prompt still matches */
        from_scratch(m, kv, 3, sys, 45, miss);
        lm_kv_cache_truncate(kv, 3, 0);
        CHECK(lm_prefix_cache_match(pc, sys, 45, 44, blocks, &nb) == 44);
        CHECK(lm_kv_cache_attach(kv, 3, blocks, nb, 44) == LM_OK);
        CHECK(lm_kv_cache_cow(kv, 3, 44) == LM_OK);
        lm_batch last = {1, sys + 44, pos + 44, sq, NULL};
        int32_t sq3[1] = {3};
        last.seq = sq3;
        CHECK(lm_forward(m, kv, &last, hit) == LM_OK);
        CHECK(memcmp(hit, miss, sizeof(float) * (size_t)V) == 0);
        lm_kv_cache_truncate(kv, 3, 0);
    }
    lm_prefix_cache_free(pc);
    CHECK(kv->n_free == kv->n_blocks);
    lm_kv_cache_free(kv);
    free(miss);
    free(hit);
    lm_model_internal_free(m);
    unlink(path);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/lumen-test-prefix-%d", (int)getpid());
    mkdir(g_dir, 0755);
    lm_backend *b;
    CHECK(lm_backend_cpu_create(2, &b) == LM_OK);
    test_sharing(b);
    test_tree(b);
    test_hit_equals_miss(b, LM_ARCH_LLAMA, LM_DTYPE_F16);
    test_hit_equals_miss(b, LM_ARCH_QWEN2, LM_DTYPE_F32);
    test_hit_equals_miss(b, LM_ARCH_GEMMA3, LM_DTYPE_F16);
    lm_backend_free(b);
    rmdir(g_dir);
    TEST_MAIN_END();
}
