/* lumen chat [MODEL]: an interactive conversation over the public API.
 *
 * Each turn renders the whole history with the model's chat template and starts a
 * request in one context; the context keeps the tokens of earlier turns, so only
 * the new part is computed. /reset forgets the history, /exit (or end of input)
 * leaves; Ctrl-C stops the answer being written and returns to the prompt. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "gen_options.h"

#define CHAT_TEMPERATURE 0.7f
#define CHAT_MAX_TOKENS 1024

typedef struct history {
    lm_chat_message *msgs;
    char **owned; /* the strings of msgs, owned */
    size_t n, cap;
} history;

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen chat [MODEL] [options]\n"
            "  an interactive chat: type a message and press Enter. Commands:\n"
            "    /reset   forget the conversation (the system message stays)\n"
            "    /exit    leave (so does end of input, Ctrl-D)\n"
            "  Ctrl-C stops the answer being written; the conversation goes on.\n"
            "  --no-stats                do not print statistics after each answer (default: printed)\n");
    gen_options_usage(f, CHAT_TEMPERATURE, CHAT_MAX_TOKENS);
}

static int history_push(history *h, const char *role, const char *content, size_t len) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 16;
        lm_chat_message *m = realloc(h->msgs, cap * sizeof *m);
        if (!m) return 1;
        h->msgs = m;
        char **o = realloc(h->owned, cap * sizeof *o);
        if (!o) return 1;
        h->owned = o;
        h->cap = cap;
    }
    char *c = malloc(len + 1);
    if (!c) return 1;
    memcpy(c, content, len);
    c[len] = '\0';
    h->owned[h->n] = c;
    h->msgs[h->n] = (lm_chat_message){role, c};
    h->n++;
    return 0;
}

static void history_truncate(history *h, size_t n) {
    while (h->n > n) free(h->owned[--h->n]);
}

/* The tokens of the history rendered with a generation prompt; NULL on error (printed). */
static int32_t *render_tokens(const lm_model *model, const history *h, size_t *n) {
    lm_chat_params cp = lm_chat_default_params();
    size_t len = 0;
    char *text = NULL;
    int32_t *ids = NULL;
    uint32_t flags = LM_TOKENIZE_ADD_SPECIAL | LM_TOKENIZE_PARSE_SPECIAL;
    if (lm_chat_render(model, h->msgs, h->n, cp, NULL, 0, &len) == LM_OK && (text = malloc(len + 1)) &&
        lm_chat_render(model, h->msgs, h->n, cp, text, len + 1, &len) == LM_OK &&
        lm_tokenize(model, text, len, flags, NULL, 0, n) == LM_OK && (ids = malloc(sizeof(int32_t) * (*n + 1))) &&
        lm_tokenize(model, text, len, flags, ids, *n, n) == LM_OK) {
        free(text);
        return ids;
    }
    fprintf(stderr, "lumen chat: %s\n", lm_last_error());
    free(text);
    free(ids);
    return NULL;
}

/* Reads one line (without its newline) into a growing buffer. 1: a line, 0: end of
 * input, -1: interrupted by Ctrl-C. */
static int read_line(char **buf, size_t *cap) {
    size_t n = 0;
    for (;;) {
        if (n + 2 > *cap) {
            size_t c = *cap ? *cap * 2 : 256;
            char *b = realloc(*buf, c);
            if (!b) return 0;
            *buf = b;
            *cap = c;
        }
        char ch;
        ssize_t r = read(STDIN_FILENO, &ch, 1);
        if (r < 0 && errno == EINTR) return -1;
        if (r <= 0) {
            (*buf)[n] = '\0';
            return n > 0 ? 1 : 0;
        }
        if (ch == '\n') break;
        (*buf)[n++] = ch;
    }
    if (n && (*buf)[n - 1] == '\r') n--;
    (*buf)[n] = '\0';
    return 1;
}

int cmd_chat(int argc, char **argv) {
    gen_options g;
    gen_options_init(&g, CHAT_TEMPERATURE, CHAT_MAX_TOKENS);
    bool model_set = false, no_stats = false;
    for (int i = 1; i < argc; i++) {
        int r = gen_options_parse(&g, argc, argv, &i, "chat");
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--no-stats")) {
            no_stats = true;
        } else if (argv[i][0] != '-' && !model_set) {
            g.model = argv[i];
            model_set = true;
        } else {
            fprintf(stderr, "lumen chat: unknown option or missing value: %s (see lumen chat --help)\n", argv[i]);
            return 2;
        }
    }
    lm_model *model = NULL;
    lm_context *ctx = NULL;
    history h = {0};
    char *line = NULL, *answer = NULL;
    size_t line_cap = 0, answer_cap = 0;
    int rc = 1;
    if (gen_load_model(&g, "chat", &model)) goto done;
    if (!lm_model_has_chat_template(model)) {
        fprintf(stderr, "lumen chat: %s has no chat template; use `lumen run --raw`\n", lm_model_path(model));
        goto done;
    }
    if (lm_context_create(model, lm_context_default_params(), &ctx) != LM_OK) {
        fprintf(stderr, "lumen chat: %s\n", lm_last_error());
        goto done;
    }
    if (g.system && history_push(&h, "system", g.system, strlen(g.system))) goto oom;
    size_t base = h.n;
    gen_sigint_install();
    bool tty = isatty(STDIN_FILENO);
    fprintf(stderr, "lumen chat: %s (context %d tokens). /reset forgets, /exit leaves, Ctrl-C stops an answer.\n",
            lm_model_path(model), lm_context_n_ctx(ctx));
    for (;;) {
        printf("> ");
        fflush(stdout);
        gen_sigint_pending = 0;
        int got = read_line(&line, &line_cap);
        if (got > 0) gen_sigint_pending = 0; /* a Ctrl-C from here on is meant for the answer */
        if (got < 0) {
            printf("\n(Ctrl-C: type /exit or press Ctrl-D to leave)\n");
            continue;
        }
        if (got == 0) {
            if (tty) printf("\n");
            break;
        }
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            history_truncate(&h, base);
            lm_context_reset(ctx);
            printf("(conversation forgotten)\n");
            continue;
        }
        if (!line[0]) continue;
        if (line[0] == '/' && strchr(line, ' ') == NULL) {
            printf("(unknown command %s: /reset, /exit)\n", line);
            continue;
        }
        size_t mark = h.n;
        if (history_push(&h, "user", line, strlen(line))) goto oom;
        size_t n_ids = 0;
        int32_t *ids = render_tokens(model, &h, &n_ids);
        lm_request *req = NULL;
        if (!ids || lm_request_start(ctx, ids, n_ids, &g.gen, &req) != LM_OK) {
            if (ids) fprintf(stderr, "lumen chat: %s%s\n", lm_last_error(), " (try /reset)");
            free(ids);
            history_truncate(&h, mark);
            continue;
        }
        free(ids);
        gen_sigint_watch(req);
        if (gen_sigint_pending) lm_request_cancel(req); /* Ctrl-C pressed while the prompt was prepared */
        size_t answer_len = 0;
        lm_step s;
        lm_status st;
        while ((st = lm_request_next(req, &s)) == LM_OK) {
            fwrite(s.text, 1, s.text_len, stdout);
            fflush(stdout);
            if (answer_len + s.text_len + 1 > answer_cap) {
                answer_cap = (answer_len + s.text_len + 1) * 2;
                char *a = realloc(answer, answer_cap);
                if (!a) {
                    gen_sigint_watch(NULL);
                    lm_request_free(req);
                    goto oom;
                }
                answer = a;
            }
            memcpy(answer + answer_len, s.text, s.text_len);
            answer_len += s.text_len;
            if (s.finish) break;
        }
        gen_sigint_watch(NULL);
        lm_stats stats;
        lm_request_stats(req, &stats);
        lm_request_free(req);
        printf("\n");
        if (st != LM_OK) {
            fprintf(stderr, "lumen chat: %s\n", lm_last_error());
            history_truncate(&h, mark);
            continue;
        }
        if (stats.finish == LM_FINISH_CANCELLED) printf("(stopped)\n");
        fflush(stdout);
        if (!no_stats) gen_print_stats(stderr, &stats);
        /* the answer so far stays in the conversation, also when stopped */
        if (history_push(&h, "assistant", answer ? answer : "", answer_len)) goto oom;
    }
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "lumen chat: out of memory\n");
done:
    history_truncate(&h, 0);
    free(h.msgs);
    free(h.owned);
    free(line);
    free(answer);
    lm_context_free(ctx);
    lm_model_free(model);
    return rc;
}
