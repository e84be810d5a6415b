/* The tokenizer entry points: special-token partitioning, then the model (BPE or SPM)
 * per raw fragment; pieces and whole-sequence detokenization. */
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

struct lm_tokenizer {
    lm_vocab *v;
};

lm_status lm_tokenizer_create(const lm_vocab_desc *desc, lm_tokenizer **out) {
    if (!out) return lm_error(LM_ERR_INVALID_ARG, "tokenizer: out is NULL");
    *out = NULL;
    lm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    lm_status st = lm_vocab_build(desc, &t->v);
    if (st) {
        free(t);
        return st;
    }
    *out = t;
    return LM_OK;
}

void lm_tokenizer_free(lm_tokenizer *tok) {
    if (!tok) return;
    lm_vocab_free(tok->v);
    free(tok);
}

const lm_vocab *lm_tokenizer_vocab(const lm_tokenizer *tok) { return tok->v; }

/* ---- tokenize ---- */

static lm_status tokenize_into(const lm_vocab *v, const char *text, size_t len,
                               bool add_special, bool parse_special, lm_ivec *out) {
    lm_fragvec frags = {0};
    lm_status st = lm_special_partition(v, text, len, parse_special, &frags);
    if (st) goto done;
    if (v->model == LM_VOCAB_SPM) {
        bool prev_special = true; /* the first fragment gets the space prefix */
        if (add_special && v->add_bos && !lm_ivec_push(out, v->bos)) goto oom;
        lm_bytes buf = {0};
        for (size_t i = 0; i < frags.n && !st; i++) {
            const lm_fragment *f = &frags.v[i];
            if (f->token != LM_TOKEN_NULL) {
                if (!lm_ivec_push(out, f->token)) {
                    free(buf.p);
                    goto oom;
                }
                prev_special = true;
                continue;
            }
            buf.n = 0;
            if (v->add_space_prefix && prev_special && !lm_bytes_append(&buf, " ", 1)) {
                free(buf.p);
                goto oom;
            }
            if (v->normalizer != LM_NORM_NONE) {
                st = lm_normalize(v->normalizer, text + f->off, f->len, &buf);
            } else if (!lm_bytes_append(&buf, text + f->off, f->len)) {
                free(buf.p);
                goto oom;
            }
            if (!st) st = lm_spm_encode(v, buf.p, buf.n, out);
            prev_special = false;
        }
        free(buf.p);
        if (st) goto done;
        if (add_special && v->add_eos && !lm_ivec_push(out, v->eos)) goto oom;
    } else {
        if (add_special && v->add_bos && !lm_ivec_push(out, v->bos)) goto oom;
        lm_bytes norm = {0};
        lm_bpe_cache *cache = NULL;
        for (size_t i = 0; i < frags.n && !st; i++) {
            const lm_fragment *f = &frags.v[i];
            if (f->token != LM_TOKEN_NULL) {
                if (!lm_ivec_push(out, f->token)) {
                    free(norm.p);
        lm_bpe_cache_free(cache);
                    lm_bpe_cache_free(cache);
                    goto oom;
                }
            } else if (v->normalizer != LM_NORM_NONE) {
                norm.n = 0;
                st = lm_normalize(v->normalizer, text + f->off, f->len, &norm);
                if (!st) st = lm_bpe_encode(v, norm.p, norm.n, &cache, out);
            } else {
                st = lm_bpe_encode(v, text + f->off, f->len, &cache, out);
            }
        }
        free(norm.p);
        lm_bpe_cache_free(cache);
        if (st) goto done;
        if (add_special && v->add_eos && !lm_ivec_push(out, v->eos)) goto oom;
    }
    goto done;
oom:
    st = lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
done:
    free(frags.v);
    return st;
}

lm_status lm_tokenizer_encode_alloc(const lm_tokenizer *tok, const char *text, size_t len,
                            bool add_special, bool parse_special, int32_t **ids, size_t *n) {
    if (!tok || !ids || !n || (!text && len))
        return lm_error(LM_ERR_INVALID_ARG, "tokenizer_encode: NULL argument");
    *ids = NULL;
    *n = 0;
    lm_ivec out = {0};
    lm_status st = tokenize_into(tok->v, text, len, add_special, parse_special, &out);
    if (st) {
        free(out.v);
        return st;
    }
    if (out.n == 0) {
        free(out.v);
        return LM_OK;
    }
    *ids = out.v;
    *n = out.n;
    return LM_OK;
}

lm_status lm_tokenizer_encode(const lm_tokenizer *tok, const char *text, size_t len, bool add_special,
                      bool parse_special, int32_t *ids, size_t cap, size_t *n_out) {
    if (!n_out || (!ids && cap)) return lm_error(LM_ERR_INVALID_ARG, "tokenizer_encode: NULL argument");
    *n_out = 0;
    int32_t *all;
    size_t n;
    lm_status st = lm_tokenizer_encode_alloc(tok, text, len, add_special, parse_special, &all, &n);
    if (st) return st;
    if (n && cap) memcpy(ids, all, (n < cap ? n : cap) * sizeof *ids);
    free(all);
    *n_out = n;
    return LM_OK;
}

/* ---- pieces ---- */

static bool piece_of(const lm_vocab *v, int32_t id, lm_bytes *b) {
    const lm_token_rec *t = &v->tok[id];
    const char *s = v->text + t->off;
    if (t->attr & (LM_TOKEN_ATTR_UNKNOWN | LM_TOKEN_ATTR_CONTROL | LM_TOKEN_ATTR_USER_DEFINED))
        return lm_bytes_append(b, s, t->len);
    if (v->model == LM_VOCAB_SPM) {
        if (t->attr & LM_TOKEN_ATTR_NORMAL) {
            for (uint32_t i = 0; i < t->len; i++) {
                if (i + 2 < t->len && (uint8_t)s[i] == 0xE2 && (uint8_t)s[i + 1] == 0x96 &&
                    (uint8_t)s[i + 2] == 0x81) {
                    if (!lm_bytes_append(b, " ", 1)) return false;
                    i += 2;
                } else if (!lm_bytes_append(b, s + i, 1)) {
                    return false;
                }
            }
            return true;
        }
        if (t->attr & LM_TOKEN_ATTR_BYTE) {
            /* "<0xNN>" */
            unsigned x = 0;
            for (uint32_t i = 3; i < t->len && i < 5; i++) {
                char c = s[i];
                x = x * 16 + (unsigned)(c >= '0' && c <= '9' ? c - '0'
                                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                        : c >= 'A' && c <= 'F' ? c - 'A' + 10 : 0);
            }
            char c = (char)x;
            return lm_bytes_append(b, &c, 1);
        }
        return true;
    }
    if (t->attr & LM_TOKEN_ATTR_NORMAL) {
        /* undo the GPT-2 byte encoding, one code point at a time */
        for (uint32_t i = 0; i < t->len;) {
            uint8_t c0 = (uint8_t)s[i];
            size_t n = lm_utf8_len(c0);
            if (i + n > t->len) n = t->len - i;
            uint32_t cp = c0;
            if (n == 2) cp = ((c0 & 0x1Fu) << 6) | ((uint8_t)s[i + 1] & 0x3Fu);
            int byte = n <= 2 ? lm_cpt_to_byte(cp) : -1;
            if (byte >= 0) {
                char c = (char)byte;
                if (!lm_bytes_append(b, &c, 1)) return false;
            } else if (!lm_bytes_append(b, s + i, n)) {
                return false;
            }
            i += (uint32_t)n;
        }
    }
    return true;
}

lm_status lm_vocab_build_pieces(lm_vocab *v) {
    v->piece_off = malloc(((size_t)v->n_tokens + 1) * sizeof *v->piece_off);
    if (!v->piece_off) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    lm_bytes b = {0};
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        v->piece_off[i] = (uint32_t)b.n;
        if (!piece_of(v, (int32_t)i, &b) || b.n > UINT32_MAX / 2) {
            free(b.p);
            return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory for token pieces");
        }
    }
    v->piece_off[v->n_tokens] = (uint32_t)b.n;
    if (!b.p && !lm_bytes_append(&b, "", 0)) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    v->piece_text = b.p;
    return LM_OK;
}

lm_status lm_tokenizer_piece(const lm_tokenizer *tok, int32_t id, bool special,
                             const char **piece, size_t *len) {
    const lm_vocab *v = tok->v;
    if (id < 0 || (uint32_t)id >= v->n_tokens)
        return lm_error(LM_ERR_INVALID_ARG, "tokenizer: token id %d out of range (vocab %u)", id,
                        v->n_tokens);
    *piece = v->piece_text + v->piece_off[id];
    *len = v->piece_off[id + 1] - v->piece_off[id];
    if (!special && (v->tok[id].attr & (LM_TOKEN_ATTR_UNKNOWN | LM_TOKEN_ATTR_CONTROL))) *len = 0;
    return LM_OK;
}

lm_status lm_tokenizer_token_to_piece(const lm_tokenizer *tok, int32_t id, bool special, char *buf,
                            size_t cap, size_t *n_out) {
    if (!n_out || (!buf && cap)) return lm_error(LM_ERR_INVALID_ARG, "token_to_piece: NULL argument");
    const char *p;
    size_t n;
    lm_status st = lm_tokenizer_piece(tok, id, special, &p, &n);
    if (st) return st;
    if (n && cap) memcpy(buf, p, n < cap ? n : cap);
    *n_out = n;
    return LM_OK;
}

/* llama.cpp's three clean-up passes, in place; returns the new length. */
static size_t clean_spaces(char *t, size_t total) {
    size_t n1 = total, n = total ? 1 : 0;
    for (size_t i = 1; i < n1; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) n--;
        t[n++] = x;
    }
    size_t n2 = n;
    n = n ? 1 : 0;
    for (size_t i = 1; i < n2; i++) {
        char x = t[i];
        if (x == '\'' && i + 1 < n2 && t[i - 1] == ' ' && t[i + 1] == ' ') {
            n--;
            t[++i] = '\0';
        }
        t[n++] = x;
    }
    size_t n3 = n;
    n = n ? 1 : 0;
    for (size_t i = 1; i < n3; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && x == '\'' && i + 1 < n3) {
            char x1 = t[i + 1];
            if (x1 == 's' || x1 == 'm') {
                n--;
            } else if (i + 2 < n3) {
                char x2 = t[i + 2];
                if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) n--;
            }
        }
        t[n++] = x;
    }
    return n;
}

lm_status lm_tokenizer_decode(const lm_tokenizer *tok, const int32_t *ids, size_t n,
                        bool remove_special, bool unparse_special, char *buf, size_t cap,
                        size_t *n_out) {
    if (!tok || !n_out || (!ids && n) || (!buf && cap))
        return lm_error(LM_ERR_INVALID_ARG, "tokenizer_decode: NULL argument");
    *n_out = 0;
    const lm_vocab *v = tok->v;
    bool remove_space = v->add_space_prefix;
    if (remove_special && v->add_bos && n > 0 && ids[0] == v->bos) {
        remove_space = false;
        ids++;
        n--;
    }
    if (remove_special && v->add_eos && n > 0 && ids[n - 1] == v->eos) n--;
    lm_bytes b = {0};
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t len;
        lm_status st = lm_tokenizer_piece(tok, ids[i], unparse_special, &p, &len);
        if (st) {
            free(b.p);
            return st;
        }
        if (remove_space && len && p[0] == ' ') p++, len--;
        remove_space = false;
        if (!lm_bytes_append(&b, p, len)) {
            free(b.p);
            return lm_error(LM_ERR_NO_MEMORY, "tokenizer_decode: out of memory");
        }
    }
    size_t total = b.n;
    if (v->clean_spaces && total) total = clean_spaces(b.p, total);
    if (total && cap) memcpy(buf, b.p, total < cap ? total : cap);
    free(b.p);
    *n_out = total;
    return LM_OK;
}

/* ---- facts ---- */

uint32_t lm_tokenizer_n_vocab(const lm_tokenizer *tok) { return tok->v->n_tokens; }
lm_vocab_model lm_tokenizer_model(const lm_tokenizer *tok) { return tok->v->model; }
lm_pre_kind lm_tokenizer_pre(const lm_tokenizer *tok) { return tok->v->pre; }
int32_t lm_tokenizer_bos(const lm_tokenizer *tok) { return tok->v->bos; }
int32_t lm_tokenizer_eos(const lm_tokenizer *tok) { return tok->v->eos; }
int32_t lm_tokenizer_eot(const lm_tokenizer *tok) { return tok->v->eot; }
int32_t lm_tokenizer_eom(const lm_tokenizer *tok) { return tok->v->eom; }
int32_t lm_tokenizer_unk(const lm_tokenizer *tok) { return tok->v->unk; }
int32_t lm_tokenizer_pad(const lm_tokenizer *tok) { return tok->v->pad; }
int32_t lm_tokenizer_sep(const lm_tokenizer *tok) { return tok->v->sep; }
bool lm_tokenizer_add_bos(const lm_tokenizer *tok) { return tok->v->add_bos; }
bool lm_tokenizer_add_eos(const lm_tokenizer *tok) { return tok->v->add_eos; }
bool lm_tokenizer_add_space_prefix(const lm_tokenizer *tok) { return tok->v->add_space_prefix; }

bool lm_tokenizer_is_eog(const lm_tokenizer *tok, int32_t id) {
    if (id < 0) return false;
    for (size_t i = 0; i < tok->v->n_eog; i++)
        if (tok->v->eog[i] == id) return true;
    return false;
}

const char *lm_tokenizer_token_text(const lm_tokenizer *tok, int32_t id, size_t *len) {
    if (id < 0 || (uint32_t)id >= tok->v->n_tokens) return NULL;
    if (len) *len = tok->v->tok[id].len;
    return lm_vocab_tok_text(tok->v, id);
}

float lm_tokenizer_token_score(const lm_tokenizer *tok, int32_t id) {
    if (id < 0 || (uint32_t)id >= tok->v->n_tokens) return 0.0f;
    return tok->v->tok[id].score;
}

uint32_t lm_tokenizer_token_attr(const lm_tokenizer *tok, int32_t id) {
    if (id < 0 || (uint32_t)id >= tok->v->n_tokens) return 0;
    return tok->v->tok[id].attr;
}

int32_t lm_tokenizer_find(const lm_tokenizer *tok, const char *text, size_t len) {
    return lm_vocab_find(tok->v, text, len);
}
