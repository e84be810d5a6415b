#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>

static void default_log(lm_log_level level, const char *message, void *user_data) {
    (void)user_data;
    if (level >= LM_LOG_WARN) fprintf(stderr, "lumen: %s\n", message);
}

static lm_log_fn g_log_fn = default_log;
static void *g_log_user;

void lm_set_log_callback(lm_log_fn fn, void *user_data) {
    g_log_fn = fn;
    g_log_user = user_data;
}

void lm_log(lm_log_level level, const char *fmt, ...) {
    if (!g_log_fn) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    g_log_fn(level, line, g_log_user);
}
