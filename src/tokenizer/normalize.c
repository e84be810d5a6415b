/* Unicode normalization (NFC/NFD/NFKC/NFKD) of raw text before tokenization, as
 * tokenizer.json normalizers ask, through utf8proc. utf8proc refuses invalid UTF-8, so
 * the text is cut into maximal valid runs; invalid bytes pass through unchanged (the
 * byte-level models then encode them byte-wise). ASCII runs are already normalized
 * in every form and are copied without a call. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

/* Length of the valid UTF-8 sequence at s[0..n) (strict: no overlongs, surrogates or
 * code points past U+10FFFF), 0 if invalid. */
static size_t valid_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t k;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) k = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) k = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) k = 4, cp = c & 0x07;
    else return 0;
    if (k > n) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return k;
}

/* Code points that NFC leaves alone whatever surrounds them: NFC_Quick_Check=Yes,
 * canonical combining class 0, and never the second half of a composition (a composing
 * mark or jamo that follows is not in these ranges, so its run takes the full path). */
static bool nfc_inert(uint32_t cp) {
    return cp < 0x300 || (cp >= 0x400 && cp <= 0x482) || (cp >= 0x3040 && cp <= 0x3096) ||
           (cp >= 0x30A0 && cp <= 0x30FF) || (cp >= 0x4E00 && cp <= 0x9FFF) ||
           (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0x1F300 && cp <= 0x1FAFF);
}

static lm_status map_segment(int opts, const char *s, size_t n, lm_bytes *out) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opts);
    if (m < 0) {
        /* cannot happen on validated input except for memory; keep the text as it is */
        free(dst);
        if (m == UTF8PROC_ERROR_NOMEM) return LM_ERR_NO_MEMORY;
        return lm_bytes_append(out, s, n) ? LM_OK : LM_ERR_NO_MEMORY;
    }
    bool ok = lm_bytes_append(out, dst, (size_t)m);
    free(dst);
    return ok ? LM_OK : LM_ERR_NO_MEMORY;
}

/* s[0..n) is valid UTF-8. Normalization never reaches across the boundary before an
 * ASCII character (a starter that composes with nothing before it), so the text is cut
 * there: stretches of inert characters are copied, and only the pieces between ASCII
 * characters that hold something else go through utf8proc. */
static lm_status normalize_run(int opts, const char *s, size_t n, lm_bytes *out) {
    bool nfc = (opts & UTF8PROC_COMPOSE) && !(opts & UTF8PROC_COMPAT);
    const uint8_t *p = (const uint8_t *)s;
    size_t seg = 0;       /* output is done up to here */
    size_t last_cut = 0;  /* the latest boundary before an ASCII character */
    bool dirty = false;   /* [seg, i) needs utf8proc */
    lm_status st = LM_OK;
    for (size_t i = 0; i < n && !st;) {
        uint8_t c = p[i];
        if (c < 0x80) {
            if (dirty) {
                st = map_segment(opts, s + seg, i - seg, out);
                seg = i;
                dirty = false;
            }
            last_cut = i;
            i++;
            continue;
        }
        uint32_t cp;
        size_t k;
        if (c < 0xE0) cp = ((c & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu), k = 2;
        else if (c < 0xF0) cp = ((c & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu), k = 3;
        else cp = ((c & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) | ((p[i + 2] & 0x3Fu) << 6) | (p[i + 3] & 0x3Fu), k = 4;
        if (!dirty && !(nfc && nfc_inert(cp))) {
            if (last_cut > seg && !lm_bytes_append(out, s + seg, last_cut - seg)) st = LM_ERR_NO_MEMORY;
            if (last_cut > seg) seg = last_cut;
            dirty = true;
        }
        i += k;
    }
    if (st) return st;
    if (dirty) return map_segment(opts, s + seg, n - seg, out);
    return lm_bytes_append(out, s + seg, n - seg) ? LM_OK : LM_ERR_NO_MEMORY;
}

lm_status lm_normalize(lm_norm_kind kind, const char *text, size_t len, lm_bytes *out) {
    int opts = UTF8PROC_STABLE;
    switch (kind) {
    case LM_NORM_NFC: opts |= UTF8PROC_COMPOSE; break;
    case LM_NORM_NFD: opts |= UTF8PROC_DECOMPOSE; break;
    case LM_NORM_NFKC: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case LM_NORM_NFKD: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    default: return lm_bytes_append(out, text, len) ? LM_OK : lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    }
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0;
    lm_status st = LM_OK;
    if (!lm_bytes_append(out, "", 0)) st = LM_ERR_NO_MEMORY;
    while (i < len && !st) {
        size_t start = i, k;
        while (i < len && (k = valid_len(s + i, len - i)) > 0) i += k;
        if (i > start) st = normalize_run(opts, text + start, i - start, out);
        start = i;
        while (!st && i < len && valid_len(s + i, len - i) == 0) i++;
        if (!st && i > start && !lm_bytes_append(out, text + start, i - start)) st = LM_ERR_NO_MEMORY;
    }
    if (st) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory normalizing text");
    return LM_OK;
}
