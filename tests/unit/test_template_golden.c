/* Renders every chat template in tests/golden/templates/ on every conversation of
 * conversations.json and compares byte for byte with what Python's jinja2 rendered there
 * (expected/<template>.json, written by scripts/make_template_golden.py). Where jinja2 raised,
 * lumen must fail too. Prints a pass count per template and in total.
 *
 * Pairs listed in known_failures.txt ("template conversation" per line) are reported but do not
 * fail the test; the list is meant to stay empty. Set LM_TEMPLATE_GOLDEN_VERBOSE=1 to see diffs. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test.h"
#include "tokenizer/template/template.h"

#define GOLDEN LUMEN_SOURCE_DIR "/tests/golden/templates"

/* The instant make_template_golden.py pins strftime_now to: 2025-03-07 14:05:09, local time. */
static int64_t fixed_now(void) {
    struct tm tm = {.tm_year = 2025 - 1900, .tm_mon = 2, .tm_mday = 7, .tm_hour = 14, .tm_min = 5, .tm_sec = 9,
                    .tm_isdst = -1};
    return (int64_t)mktime(&tm);
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!buf) return NULL;
    buf[got] = '\0';
    if (len) *len = got;
    return buf;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void show_diff(const char *want, size_t wn, const char *got, size_t gn) {
    size_t i = 0;
    while (i < wn && i < gn && want[i] == got[i]) i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "    first difference at byte %zu\n    want: %.*s\n    got:  %.*s\n", i,
            (int)((wn - from) > 160 ? 160 : wn - from), want + from, (int)((gn - from) > 160 ? 160 : gn - from), got + from);
}

int main(void) {
    bool verbose = getenv("LM_TEMPLATE_GOLDEN_VERBOSE") != NULL;
    char *convs_text = slurp(GOLDEN "/conversations.json", NULL);
    if (!convs_text) {
        fprintf(stderr, "cannot read %s/conversations.json\n", GOLDEN);
        return 1;
    }
    cJSON *convs = cJSON_Parse(convs_text);
    CHECK(convs != NULL);
    char *known = slurp(GOLDEN "/known_failures.txt", NULL);

    DIR *d = opendir(GOLDEN);
    CHECK(d != NULL);
    char *names[512];
    int nnames = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && nnames < 512) {
        size_t l = strlen(e->d_name);
        if (l > 6 && strcmp(e->d_name + l - 6, ".jinja") == 0) names[nnames++] = strdup(e->d_name);
    }
    if (d) closedir(d);
    qsort(names, (size_t)nnames, sizeof *names, cmp_str);

    lm_template_limits lim = {.now = fixed_now()};
    int total = 0, passed = 0, known_failed = 0, templates_all_pass = 0;
    for (int ti = 0; ti < nnames; ti++) {
        char path[1024], stem[512];
        snprintf(stem, sizeof stem, "%.*s", (int)(strlen(names[ti]) - 6), names[ti]);
        snprintf(path, sizeof path, "%s/%s", GOLDEN, names[ti]);
        size_t srclen;
        char *src = slurp(path, &srclen);
        snprintf(path, sizeof path, "%s/expected/%s.json", GOLDEN, stem);
        char *exp_text = slurp(path, NULL);
        cJSON *expected = exp_text ? cJSON_Parse(exp_text) : NULL;
        if (!src || !expected) {
            fprintf(stderr, "%s: missing source or expected outputs\n", stem);
            lm_test_failures++;
            free(src);
            free(exp_text);
            cJSON_Delete(expected);
            continue;
        }
        lm_template *t = NULL;
        lm_status pst = lm_template_parse(src, srclen, &t);
        char parse_err[1024] = "";
        if (pst != LM_OK) snprintf(parse_err, sizeof parse_err, "%s", lm_last_error());
        int tpass = 0, tn = 0;
        cJSON *conv;
        cJSON_ArrayForEach(conv, convs) {
            cJSON *want = cJSON_GetObjectItemCaseSensitive(expected, conv->string);
            if (!want) continue;
            tn++;
            total++;
            cJSON *want_out = cJSON_GetObjectItemCaseSensitive(want, "output");
            cJSON *want_err = cJSON_GetObjectItemCaseSensitive(want, "error");
            char *msgs = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(conv, "messages"));
            cJSON *tools_j = cJSON_GetObjectItemCaseSensitive(conv, "tools");
            char *tools = tools_j ? cJSON_PrintUnformatted(tools_j) : NULL;
            cJSON *extra_j = cJSON_GetObjectItemCaseSensitive(conv, "extra");
            char *extra = extra_j ? cJSON_PrintUnformatted(extra_j) : NULL;
            bool agp = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(conv, "add_generation_prompt"));
            char *out = NULL;
            size_t out_len = 0;
            lm_status st = pst;
            char why[1200] = "";
            if (t) {
                st = lm_template_render_chat_ex(t, msgs, tools, agp, "<s>", "</s>", extra, &lim, &out, &out_len);
                if (st != LM_OK) snprintf(why, sizeof why, "%s", lm_last_error());
            } else {
                snprintf(why, sizeof why, "%s", parse_err);
            }
            bool ok;
            if (want_err) {
                ok = st != LM_OK;
                if (ok && getenv("LM_TEMPLATE_GOLDEN_ERRORS"))
                    printf("  %s / %s:\n    jinja2: %s\n    lumen:  %s\n", stem, conv->string, want_err->valuestring, why);
                if (!ok && verbose) fprintf(stderr, "  %s / %s: jinja2 raised (%s) but lumen rendered\n", stem,
                                            conv->string, want_err->valuestring);
            } else {
                const char *w = cJSON_GetStringValue(want_out);
                size_t wn = w ? strlen(w) : 0;
                ok = st == LM_OK && w && out_len == wn && memcmp(out, w, wn) == 0;
                if (!ok && verbose) {
                    if (st != LM_OK) fprintf(stderr, "  %s / %s: lumen failed: %s\n", stem, conv->string, why);
                    else {
                        fprintf(stderr, "  %s / %s: output differs\n", stem, conv->string);
                        show_diff(w ? w : "", wn, out, out_len);
                    }
                }
            }
            if (ok) {
                tpass++;
                passed++;
            } else {
                char key[700];
                snprintf(key, sizeof key, "%s %s\n", stem, conv->string);
                if (known && strstr(known, key)) known_failed++;
                else lm_test_failures++;
            }
            free(out);
            free(msgs);
            free(tools);
            free(extra);
        }
        if (tpass == tn) templates_all_pass++;
        printf("%-55s %d/%d%s\n", stem, tpass, tn, tpass == tn ? "" : "  <-- mismatch");
        lm_template_free(t);
        free(src);
        free(exp_text);
        cJSON_Delete(expected);
        free(names[ti]);
    }
    printf("template golden: %d/%d renders identical, %d/%d templates fully identical, %d known failures\n", passed,
           total, templates_all_pass, nnames, known_failed);
    cJSON_Delete(convs);
    free(convs_text);
    free(known);
    CHECK(total > 0);
    TEST_MAIN_END();
}
