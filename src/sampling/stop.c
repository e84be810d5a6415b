/* Stop-string matcher (stop.h): an Aho-Corasick automaton over the stop strings,
 * stepped once per text byte, plus a buffer of the bytes not yet emitted. */
#include "sampling/stop.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* Trie node i spells a prefix of some stop string, of length depth[i]. */
typedef struct stop_node {
    int32_t child;    /* first child, -1 = none                                      */
    int32_t sibling;  /* next child of the same parent, -1 = none                    */
    int32_t fail;     /* longest proper suffix of this node's string that is a node */
    int32_t out_len;  /* length of the longest stop string ending here, 0 = none    */
    int32_t out_idx;  /* its index (lowest among duplicates)                         */
    int32_t depth;
    unsigned char byte; /* label of the edge from the parent */
} stop_node;

struct lm_stop_matcher {
    stop_node *nodes;
    int32_t n_nodes;
    int32_t root_next[256]; /* goto from the root, 0 (the root) when absent */

    int32_t state;
    char *buf;    /* bytes fed and not yet emitted (plus `drop` handed out last call) */
    size_t len, cap;
    size_t drop;  /* bytes at the front of buf given out by the previous call */
    int32_t stopped;
    bool finished;
};

static int32_t find_child(const lm_stop_matcher *m, int32_t node, unsigned char c) {
    if (node == 0) return m->root_next[c] ? m->root_next[c] : -1;
    for (int32_t ch = m->nodes[node].child; ch != -1; ch = m->nodes[ch].sibling)
        if (m->nodes[ch].byte == c) return ch;
    return -1;
}

static int32_t step(const lm_stop_matcher *m, int32_t state, unsigned char c) {
    for (;;) {
        int32_t next = find_child(m, state, c);
        if (next != -1) return next;
        if (state == 0) return 0;
        state = m->nodes[state].fail;
    }
}

lm_status lm_stop_matcher_create(const char *const *stops, const size_t *lens, size_t n_stops,
                                 lm_stop_matcher **out) {
    if (!out) return lm_error(LM_ERR_INVALID_ARG, "stop strings: out is NULL");
    *out = NULL;
    if (n_stops && !stops) return lm_error(LM_ERR_INVALID_ARG, "stop strings: stops is NULL but n_stops is %zu", n_stops);
    if (n_stops > LM_STOP_MAX_STRINGS)
        return lm_error(LM_ERR_LIMIT, "stop strings: %zu given, at most %d allowed", n_stops, LM_STOP_MAX_STRINGS);
    size_t total = 0;
    for (size_t i = 0; i < n_stops; i++) {
        if (!stops[i]) return lm_error(LM_ERR_INVALID_ARG, "stop strings: stop string %zu is NULL", i);
        size_t n = lens ? lens[i] : strlen(stops[i]);
        if (n == 0)
            return lm_error(LM_ERR_INVALID_ARG, "stop strings: stop string %zu is empty (it would match everywhere)", i);
        if (n > LM_STOP_MAX_TOTAL_BYTES - total)
            return lm_error(LM_ERR_LIMIT, "stop strings: more than %u bytes in all", LM_STOP_MAX_TOTAL_BYTES);
        total += n;
    }

    lm_stop_matcher *m = calloc(1, sizeof *m);
    if (!m) return lm_error(LM_ERR_NO_MEMORY, "stop strings: out of memory for a matcher");
    m->nodes = malloc((total + 1) * sizeof *m->nodes);
    int32_t *queue = malloc((total + 1) * sizeof *queue);
    if (!m->nodes || !queue) {
        free(queue);
        lm_stop_matcher_free(m);
        return lm_error(LM_ERR_NO_MEMORY, "stop strings: out of memory for %zu bytes of stop strings", total);
    }
    m->nodes[0] = (stop_node){-1, -1, 0, 0, -1, 0, 0};
    m->n_nodes = 1;

    /* the trie */
    for (size_t i = 0; i < n_stops; i++) {
        size_t n = lens ? lens[i] : strlen(stops[i]);
        int32_t node = 0;
        for (size_t j = 0; j < n; j++) {
            unsigned char c = (unsigned char)stops[i][j];
            int32_t next = find_child(m, node, c);
            if (next == -1) {
                next = m->n_nodes++;
                m->nodes[next] = (stop_node){-1, m->nodes[node].child, 0, 0, -1, m->nodes[node].depth + 1, c};
                m->nodes[node].child = next;
                if (node == 0) m->root_next[c] = next;
            }
            node = next;
        }
        if (m->nodes[node].out_len == 0) {
            m->nodes[node].out_len = (int32_t)n;
            m->nodes[node].out_idx = (int32_t)i;
        }
    }

    /* failure links and outputs, breadth first (a node's fail is shallower) */
    size_t qh = 0, qt = 0;
    for (int32_t ch = m->nodes[0].child; ch != -1; ch = m->nodes[ch].sibling) queue[qt++] = ch;
    while (qh < qt) {
        int32_t u = queue[qh++];
        stop_node *nu = &m->nodes[u];
        if (nu->out_len == 0 && m->nodes[nu->fail].out_len > 0) {
            /* no stop ends exactly here: the longest is the fail node's (a suffix) */
            nu->out_len = m->nodes[nu->fail].out_len;
            nu->out_idx = m->nodes[nu->fail].out_idx;
        }
        for (int32_t ch = nu->child; ch != -1; ch = m->nodes[ch].sibling) {
            m->nodes[ch].fail = u == 0 ? 0 : step(m, m->nodes[u].fail, m->nodes[ch].byte);
            queue[qt++] = ch;
        }
    }
    free(queue);
    m->stopped = -1;
    *out = m;
    return LM_OK;
}

void lm_stop_matcher_free(lm_stop_matcher *m) {
    if (!m) return;
    free(m->nodes);
    free(m->buf);
    free(m);
}

void lm_stop_matcher_reset(lm_stop_matcher *m) {
    if (!m) return;
    m->state = 0;
    m->len = m->drop = 0;
    m->stopped = -1;
    m->finished = false;
}

size_t lm_stop_matcher_held(const lm_stop_matcher *m) { return m ? m->len - m->drop : 0; }

/* Largest b' <= b such that buf[0..b') does not end inside a UTF-8 character that
 * the bytes up to b leave incomplete. Invalid bytes count as whole characters, so
 * nothing is held forever. */
static size_t utf8_safe_end(const unsigned char *s, size_t b) {
    size_t i = b, n_cont = 0;
    while (i > 0 && n_cont < 3 && (s[i - 1] & 0xC0) == 0x80) {
        i--;
        n_cont++;
    }
    if (i == 0) return b;
    unsigned char lead = s[i - 1];
    size_t need = lead >= 0xF0 && lead <= 0xF7 ? 4 : lead >= 0xE0 && lead <= 0xEF ? 3 : lead >= 0xC0 && lead <= 0xDF ? 2 : 1;
    return need > n_cont + 1 ? i - 1 : b;
}

/* Drops the bytes handed out by the previous call. */
static void consume_drop(lm_stop_matcher *m) {
    if (!m->drop) return;
    memmove(m->buf, m->buf + m->drop, m->len - m->drop);
    m->len -= m->drop;
    m->drop = 0;
}

lm_status lm_stop_matcher_feed(lm_stop_matcher *m, const char *piece, size_t len, lm_stop_output *out) {
    if (!m || !out || (len && !piece))
        return lm_error(LM_ERR_INVALID_ARG, "stop strings: feed: NULL matcher, output or piece");
    out->text = "";
    out->len = 0;
    out->stop_index = m->stopped;
    if (m->finished)
        return lm_error(LM_ERR_INVALID_ARG, "stop strings: text fed after the end of the stream (reset the matcher first)");
    consume_drop(m);
    if (m->stopped >= 0) return LM_OK;

    if (m->cap - m->len < len) {
        size_t cap = m->cap ? m->cap : 64;
        while (cap - m->len < len) {
            if (cap > SIZE_MAX / 2)
                return lm_error(LM_ERR_NO_MEMORY, "stop strings: a piece of %zu bytes is too large", len);
            cap *= 2;
        }
        char *b = realloc(m->buf, cap);
        if (!b) return lm_error(LM_ERR_NO_MEMORY, "stop strings: out of memory buffering %zu bytes", m->len + len);
        m->buf = b;
        m->cap = cap;
    }

    int32_t state = m->state;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)piece[i];
        m->buf[m->len++] = (char)c;
        state = step(m, state, c);
        if (m->nodes[state].out_len > 0) {
            m->stopped = m->nodes[state].out_idx;
            m->state = 0;
            out->text = m->buf;
            out->len = m->len - (size_t)m->nodes[state].out_len;
            out->stop_index = m->stopped;
            m->drop = m->len; /* the match and the rest of the piece are discarded */
            return LM_OK;
        }
    }
    m->state = state;
    size_t emit = utf8_safe_end((const unsigned char *)m->buf, m->len - (size_t)m->nodes[state].depth);
    out->text = m->buf ? m->buf : "";
    out->len = emit;
    m->drop = emit;
    return LM_OK;
}

lm_status lm_stop_matcher_finish(lm_stop_matcher *m, lm_stop_output *out) {
    if (!m || !out) return lm_error(LM_ERR_INVALID_ARG, "stop strings: finish: NULL matcher or output");
    consume_drop(m);
    out->text = m->buf ? m->buf : "";
    out->len = m->stopped >= 0 || m->finished ? 0 : m->len;
    out->stop_index = m->stopped;
    m->drop = m->len;
    m->finished = true;
    m->state = 0;
    return LM_OK;
}
