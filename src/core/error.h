/* Internal error reporting: set the thread-local sentence and return the status. */
#ifndef LM_CORE_ERROR_H
#define LM_CORE_ERROR_H

#include "lumen.h"

#if defined(__GNUC__)
#define LM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define LM_PRINTF(a, b)
#endif

/* Records "fmt..." as the calling thread's last error and returns `status`, so that
 * failure paths read `return lm_error(LM_ERR_FORMAT, "gguf: %s: truncated", path);` */
lm_status lm_error(lm_status status, const char *fmt, ...) LM_PRINTF(2, 3);

/* Prefixes the current error sentence with "prefix: " (for adding context while
 * unwinding) and returns `status` unchanged. */
lm_status lm_error_prefix(lm_status status, const char *fmt, ...) LM_PRINTF(2, 3);

void lm_clear_error(void);

#endif
