/* Chat templates: the subset of Jinja2 that Hugging Face chat templates use, rendered byte for byte
 * the way transformers renders them (jinja2's ImmutableSandboxedEnvironment with trim_blocks and
 * lstrip_blocks, the loopcontrols extension, the {% generation %} block, and transformers' globals
 * raise_exception / strftime_now and its tojson filter: no HTML escaping, ensure_ascii=False,
 * indent / separators / sort_keys passed through).
 *
 * Ownership: a parsed lm_template is immutable and owns all its memory; it may be rendered from
 * any number of threads at once. lm_template_free(NULL) is a no-op. Rendered text is returned in a
 * malloc'd, NUL-terminated buffer that the caller frees with free().
 *
 * Errors: every call returns an lm_status; on failure lm_last_error() holds a sentence. Parse
 * errors name line and column ("template:12:5: ..."); render errors name the line and, for
 * raise_exception(), carry the template's own message. */
#ifndef LM_TOKENIZER_TEMPLATE_H
#define LM_TOKENIZER_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lumen.h"

typedef struct lm_template lm_template;

/* Bounds that stop a hostile or runaway template. A zero field means "the default". */
typedef struct lm_template_limits {
    size_t max_output;   /* bytes of rendered text (default 8 MiB)                                */
    size_t max_memory;   /* bytes of values made while rendering (default 256 MiB)                */
    uint64_t max_steps;  /* evaluation steps: nodes evaluated + loop iterations (default 50 M)    */
    int max_depth;       /* nested macro calls (default 64)                                       */
    int64_t now;         /* the instant strftime_now() formats, seconds since the epoch, local
                            time; 0 = the real clock (tests pin it)                               */
} lm_template_limits;

enum {
    LM_TEMPLATE_MAX_SOURCE = 4 << 20, /* bytes of template source */
    LM_TEMPLATE_MAX_NESTING = 128,    /* nested blocks plus nested expression levels */
};

/* Parses `len` bytes of template source. On success *out owns a new template. Fails with
 * LM_ERR_FORMAT (syntax, "line:col: what"), LM_ERR_UNSUPPORTED (a Jinja feature outside the
 * subset, such as {% include %}), LM_ERR_LIMIT (source size or nesting) or LM_ERR_NO_MEMORY. */
lm_status lm_template_parse(const char *src, size_t len, lm_template **out);

void lm_template_free(lm_template *t);

/* Renders with the variables of `context_json`, a JSON object (NULL = no variables). Every key is
 * a template variable; JSON integers stay integers, other numbers are floats, objects keep their
 * key order. `limits` may be NULL (defaults). On success *out is a malloc'd NUL-terminated string
 * (the caller frees it) and *out_len its length without the NUL; on failure *out is NULL. */
lm_status lm_template_render_json(const lm_template *t, const char *context_json,
                                  const lm_template_limits *limits, char **out, size_t *out_len);

/* Renders a chat the way transformers' apply_chat_template does: `messages` (JSON array of
 * {"role","content",...}), `tools` (JSON array, or NULL: the variable is then None, as
 * transformers passes it), `documents` = None, add_generation_prompt, bos_token / eos_token
 * (NULL = undefined), and extra variables from `extra_context_json` (a JSON object, or NULL), which
 * override the others (for example {"enable_thinking": false}). Output as lm_template_render_json. */
lm_status lm_template_render_chat(const lm_template *t, const char *messages_json, const char *tools_json,
                                  bool add_generation_prompt, const char *bos_token, const char *eos_token,
                                  const char *extra_context_json, char **out, size_t *out_len);

/* As lm_template_render_chat, with explicit limits (NULL = defaults). */
lm_status lm_template_render_chat_ex(const lm_template *t, const char *messages_json, const char *tools_json,
                                     bool add_generation_prompt, const char *bos_token, const char *eos_token,
                                     const char *extra_context_json, const lm_template_limits *limits,
                                     char **out, size_t *out_len);

#endif
