/* lumen tokenize MODEL TEXT: the token ids and pieces of a text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "formats/gguf.h"
#include "formats/model_store.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen tokenize MODEL [TEXT] [options]\n"
            "  MODEL              a .gguf file or a name from `lumen pull`\n"
            "  TEXT               the text to tokenize (or use --file / --stdin)\n"
            "  --file PATH        read the text from a file\n"
            "  --stdin            read the text from standard input\n"
            "  --json             print one JSON object {\"ids\": [...], \"pieces\": [...]} (default: text)\n"
            "  --ids              print only the ids, space-separated (default: id and piece per line)\n"
            "  --no-bos           do not add BOS/EOS even if the model asks for them (default: added)\n"
            "  --no-parse-special treat control tokens written in the text as plain text (default: parsed)\n"
            "  --decode           also print the detokenized text (default: off)\n");
}

static char *slurp(FILE *f, size_t *len) {
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    if (!b) return NULL;
    for (;;) {
        if (n == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) {
                free(b);
                return NULL;
            }
            b = nb;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    *len = n;
    return b;
}

/* Writes s as a JSON string body; bytes that are not valid UTF-8 become \u00XX of the
 * byte (so the output stays valid JSON for pieces that are partial characters). */
static void json_str(FILE *o, const char *s, size_t n) {
    fputc('"', o);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            fprintf(o, "\\%c", c);
        } else if (c < 0x20) {
            fprintf(o, "\\u%04x", c);
        } else if (c < 0x80) {
            fputc(c, o);
        } else {
            size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
            size_t k = 1;
            while (need && k < need && i + k < n && ((unsigned char)s[i + k] & 0xC0) == 0x80) k++;
            if (need && k == need) {
                fwrite(s + i, 1, need, o);
                i += need - 1;
            } else {
                fprintf(o, "\\u%04x", c);
            }
        }
    }
    fputc('"', o);
}

/* A readable piece for the text view: control characters escaped. */
static void text_piece(FILE *o, const char *s, size_t n) {
    fputc('\'', o);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", o);
        else if (c == '\t') fputs("\\t", o);
        else if (c == '\r') fputs("\\r", o);
        else if (c < 0x20) fprintf(o, "\\x%02x", c);
        else fputc(c, o);
    }
    fputc('\'', o);
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL;
    bool json = false, ids_only = false, add_special = true, parse_special = true, decode = false,
         use_stdin = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--ids") == 0) {
            ids_only = true;
        } else if (strcmp(a, "--no-bos") == 0) {
            add_special = false;
        } else if (strcmp(a, "--no-parse-special") == 0) {
            parse_special = false;
        } else if (strcmp(a, "--decode") == 0) {
            decode = true;
        } else if (strcmp(a, "--stdin") == 0) {
            use_stdin = true;
        } else if (strcmp(a, "--file") == 0 && i + 1 < argc) {
            file = argv[++i];
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "lumen tokenize: unknown option %s\n", a);
            usage(stderr);
            return 2;
        } else if (!model) {
            model = a;
        } else if (!text) {
            text = a;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!model || (!text && !file && !use_stdin)) {
        usage(stderr);
        return 2;
    }
    char *buf = NULL;
    size_t len = 0;
    if (file || use_stdin) {
        FILE *f = file ? fopen(file, "rb") : stdin;
        if (!f) {
            fprintf(stderr, "lumen tokenize: cannot open %s\n", file);
            return 1;
        }
        buf = slurp(f, &len);
        if (file) fclose(f);
        if (!buf) {
            fprintf(stderr, "lumen tokenize: out of memory reading the text\n");
            return 1;
        }
        text = buf;
    } else {
        len = strlen(text);
    }

    char path[4096];
    lm_gguf *g = NULL;
    lm_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 1;
    if (lm_model_store_resolve(model, path, sizeof path) || lm_gguf_open(path, &g) ||
        lm_tokenizer_from_gguf(g, &tok) ||
        lm_tokenizer_encode_alloc(tok, text, len, add_special, parse_special, &ids, &n)) {
        fprintf(stderr, "lumen tokenize: %s\n", lm_last_error());
        goto done;
    }
    char *dec = NULL;
    size_t dn = 0;
    if (decode) {
        lm_tokenizer_decode(tok, ids, n, false, true, NULL, 0, &dn);
        dec = malloc(dn + 1);
        if (!dec || lm_tokenizer_decode(tok, ids, n, false, true, dec, dn, &dn)) {
            fprintf(stderr, "lumen tokenize: cannot detokenize: %s\n", lm_last_error());
            free(dec);
            goto done;
        }
    }
    if (json) {
        printf("{\"n_tokens\": %zu, \"ids\": [", n);
        for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        printf("], \"pieces\": [");
        for (size_t i = 0; i < n; i++) {
            const char *p;
            size_t pl;
            lm_tokenizer_piece(tok, ids[i], true, &p, &pl);
            if (i) printf(", ");
            json_str(stdout, p, pl);
        }
        printf("]");
        if (decode) {
            printf(", \"text\": ");
            json_str(stdout, dec, dn);
        }
        printf("}\n");
    } else if (ids_only) {
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    } else {
        for (size_t i = 0; i < n; i++) {
            const char *p;
            size_t pl;
            lm_tokenizer_piece(tok, ids[i], true, &p, &pl);
            printf("%8d  ", ids[i]);
            text_piece(stdout, p, pl);
            printf("\n");
        }
        printf("%zu tokens\n", n);
        if (decode) {
            fwrite(dec, 1, dn, stdout);
            printf("\n");
        }
    }
    free(dec);
    rc = 0;
done:
    free(ids);
    lm_tokenizer_free(tok);
    lm_gguf_close(g);
    free(buf);
    return rc;
}
