/*
 * lumen.h — the one public header of liblumen, a local LLM inference engine.
 *
 * Conventions (they hold for every function below):
 *   - Handles are opaque. `lm_*_free(NULL)` is a no-op.
 *   - Every call that can fail returns an `lm_status` (0 = ok, negative = error) and
 *     leaves a human sentence naming what was wrong in `lm_last_error()` (per thread).
 *   - The library never prints to stdout, never exits and never aborts on bad input.
 *   - Buffers follow "returns the needed size": pass a buffer and its capacity; the
 *     call returns how much it needed, so a too-small buffer can be retried.
 */
#ifndef LUMEN_H
#define LUMEN_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LUMEN_VERSION_MAJOR 0
#define LUMEN_VERSION_MINOR 1
#define LUMEN_VERSION_PATCH 0

/* ---- status codes ------------------------------------------------------------ */

typedef enum lm_status {
    LM_OK                 =  0,
    LM_ERR_INVALID_ARG    = -1,  /* a parameter is out of range or NULL where not allowed */
    LM_ERR_NO_MEMORY      = -2,  /* an allocation failed or a memory limit was reached     */
    LM_ERR_IO             = -3,  /* a file could not be opened, read, written or mapped    */
    LM_ERR_FORMAT         = -4,  /* a file is malformed: bad magic, truncated, out of range */
    LM_ERR_UNSUPPORTED    = -5,  /* well-formed but not supported: architecture, type, ... */
    LM_ERR_NOT_FOUND      = -6,  /* a named thing (tensor, key, model) does not exist      */
    LM_ERR_LIMIT          = -7,  /* a size or count exceeds a documented limit             */
    LM_ERR_INTERNAL       = -8,  /* a bug in lumen; please report it with lm_last_error() */
} lm_status;

/* A constant English name of a status ("invalid argument", ...). Never NULL. */
const char *lm_status_str(lm_status status);

/* The sentence describing the last error on the calling thread; "" if none.
 * The pointer stays valid until the next lumen call on this thread. */
const char *lm_last_error(void);

/* "0.1.0" */
const char *lm_version(void);

/* ---- logging ----------------------------------------------------------------- */

typedef enum lm_log_level { LM_LOG_DEBUG, LM_LOG_INFO, LM_LOG_WARN, LM_LOG_ERROR } lm_log_level;
typedef void (*lm_log_fn)(lm_log_level level, const char *message, void *user_data);

/* Route library log lines to `fn` (NULL silences them; the default writes WARN and
 * ERROR to stderr). Not thread-safe against concurrent logging: call it at start-up. */
void lm_set_log_callback(lm_log_fn fn, void *user_data);

#ifdef __cplusplus
}
#endif
#endif /* LUMEN_H */
