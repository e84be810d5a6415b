#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { LM_ERROR_CAP = 1024 };
static _Thread_local char g_error[LM_ERROR_CAP];

const char *lm_status_str(lm_status status) {
    switch (status) {
    case LM_OK: return "ok";
    case LM_ERR_INVALID_ARG: return "invalid argument";
    case LM_ERR_NO_MEMORY: return "out of memory";
    case LM_ERR_IO: return "i/o error";
    case LM_ERR_FORMAT: return "malformed input";
    case LM_ERR_UNSUPPORTED: return "unsupported";
    case LM_ERR_NOT_FOUND: return "not found";
    case LM_ERR_LIMIT: return "limit exceeded";
    case LM_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *lm_last_error(void) { return g_error; }

const char *lm_version(void) { return "0.1.0"; }

void lm_clear_error(void) { g_error[0] = '\0'; }

lm_status lm_error(lm_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
    return status;
}

lm_status lm_error_prefix(lm_status status, const char *fmt, ...) {
    char prefix[256], old[LM_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_error, sizeof old);
    size_t n = strlen(prefix);
    memcpy(g_error, prefix, n);
    memcpy(g_error + n, ": ", 2);
    size_t room = sizeof g_error - n - 3;
    size_t m = strnlen(old, room);
    memcpy(g_error + n + 2, old, m);
    g_error[n + 2 + m] = '\0';
    return status;
}
