/* Public entry points of the chat-template interpreter: parse, render, free. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/template/tmpl_internal.h"


lm_status lm_template_parse(const char *src, size_t len, lm_template **out) {
    if (!out) return lm_error(LM_ERR_INVALID_ARG, "template: out is NULL");
    *out = NULL;
    if (!src && len) return lm_error(LM_ERR_INVALID_ARG, "template: source is NULL");
    if (len > LM_TEMPLATE_MAX_SOURCE)
        return lm_error(LM_ERR_LIMIT, "template: source is %zu bytes, more than the limit of %d", len,
                        LM_TEMPLATE_MAX_SOURCE);
    lm_template *t = calloc(1, sizeof *t);
    if (!t) return lm_error(LM_ERR_NO_MEMORY, "template: out of memory");
    t->arena.cap = (size_t)LM_TEMPLATE_MAX_SOURCE * 64;
    lm_status st = tmpl_parse(t, src ? src : "", len);
    if (st != LM_OK) {
        lm_template_free(t);
        return st;
    }
    *out = t;
    return LM_OK;
}

void lm_template_free(lm_template *t) {
    if (!t) return;
    tmpl_arena_free(&t->arena);
    free(t);
}

static lm_template_limits resolve_limits(const lm_template_limits *in) {
    lm_template_limits l = in ? *in : (lm_template_limits){0};
    if (!l.max_output) l.max_output = 8u << 20;
    if (!l.max_memory) l.max_memory = 256u << 20;
    if (!l.max_steps) l.max_steps = 50000000;
    if (l.max_depth <= 0) l.max_depth = 64;
    return l;
}

/* Renders with `vars` (a dict value in c's arena, or undefined for none). */
static lm_status render(const lm_template *t, tmpl_ctx *c, tv vars, char **out, size_t *out_len) {
    c->out.limit = c->lim->max_output;
    int rc = tmpl_run(c, t->root, vars);
    if (rc == 0 && c->out.failed)
        rc = tmpl_fail(c, NULL, LM_ERR_LIMIT, "output larger than %zu bytes", c->lim->max_output);
    if (rc) {
        free(c->out.p);
        c->out.p = NULL;
        lm_status st = c->err != LM_OK ? c->err : LM_ERR_INTERNAL;
        if (c->errline) return lm_error(st, "template: line %d: %s", c->errline, c->errmsg);
        return lm_error(st, "template: %s", c->errmsg);
    }
    if (!c->out.p && !tbuf_put(&c->out, "", 0)) return lm_error(LM_ERR_NO_MEMORY, "template: out of memory");
    *out = c->out.p;
    if (out_len) *out_len = c->out.n;
    c->out.p = NULL;
    return LM_OK;
}

static lm_status parse_json_into(tmpl_ctx *c, const char *what, const char *json, tv *out) {
    char err[160] = "";
    if (!tv_from_json(&c->arena, json, strlen(json), out, err, sizeof err)) {
        if (c->arena.failed) return lm_error(LM_ERR_NO_MEMORY, "template: out of memory reading %s", what);
        return lm_error(LM_ERR_INVALID_ARG, "template: %s is not valid JSON: %s", what, err);
    }
    return LM_OK;
}

lm_status lm_template_render_json(const lm_template *t, const char *context_json, const lm_template_limits *limits,
                                  char **out, size_t *out_len) {
    if (!t || !out) return lm_error(LM_ERR_INVALID_ARG, "template: NULL template or output");
    *out = NULL;
    if (out_len) *out_len = 0;
    lm_template_limits lim = resolve_limits(limits);
    tmpl_ctx c = {.lim = &lim, .now = lim.now};
    c.arena.cap = lim.max_memory;
    tv vars = tv_undef(NULL);
    lm_status st = LM_OK;
    if (context_json) {
        st = parse_json_into(&c, "the context", context_json, &vars);
        if (st == LM_OK && vars.t != TV_DICT) st = lm_error(LM_ERR_INVALID_ARG, "template: the context must be a JSON object");
    }
    if (st == LM_OK) st = render(t, &c, vars, out, out_len);
    tmpl_arena_free(&c.arena);
    return st;
}

lm_status lm_template_render_chat_ex(const lm_template *t, const char *messages_json, const char *tools_json,
                                     bool add_generation_prompt, const char *bos_token, const char *eos_token,
                                     const char *extra_context_json, const lm_template_limits *limits, char **out,
                                     size_t *out_len) {
    if (!t || !out) return lm_error(LM_ERR_INVALID_ARG, "template: NULL template or output");
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!messages_json) return lm_error(LM_ERR_INVALID_ARG, "template: messages are NULL");
    lm_template_limits lim = resolve_limits(limits);
    tmpl_ctx c = {.lim = &lim, .now = lim.now};
    c.arena.cap = lim.max_memory;
    tv vars = tv_dict_new(&c.arena, 8), messages, tools = tv_none(), extra = tv_undef(NULL);
    lm_status st = vars.t == TV_DICT ? LM_OK : lm_error(LM_ERR_NO_MEMORY, "template: out of memory");
    if (st == LM_OK) st = parse_json_into(&c, "messages", messages_json, &messages);
    if (st == LM_OK && messages.t != TV_LIST) st = lm_error(LM_ERR_INVALID_ARG, "template: messages must be a JSON array");
    if (st == LM_OK && tools_json) {
        st = parse_json_into(&c, "tools", tools_json, &tools);
        if (st == LM_OK && tools.t != TV_LIST && tools.t != TV_NONE)
            st = lm_error(LM_ERR_INVALID_ARG, "template: tools must be a JSON array");
    }
    if (st == LM_OK && extra_context_json) {
        st = parse_json_into(&c, "the extra context", extra_context_json, &extra);
        if (st == LM_OK && extra.t != TV_DICT) st = lm_error(LM_ERR_INVALID_ARG, "template: the extra context must be a JSON object");
    }
    if (st == LM_OK) {
        bool ok = tv_dict_set(&c.arena, &vars, tv_cstr(&c.arena, "messages"), messages) &&
                  tv_dict_set(&c.arena, &vars, tv_cstr(&c.arena, "tools"), tools) &&
                  tv_dict_set(&c.arena, &vars, tv_cstr(&c.arena, "documents"), tv_none()) &&
                  tv_dict_set(&c.arena, &vars, tv_cstr(&c.arena, "add_generation_prompt"), tv_bool(add_generation_prompt));
        if (ok && bos_token) ok = tv_dict_set(&c.arena, &vars, tv_cstr(&c.arena, "bos_token"), tv_cstr(&c.arena, bos_token));
        if (ok && eos_token) ok = tv_dict_set(&c.arena, &vars, tv_cstr(&c.arena, "eos_token"), tv_cstr(&c.arena, eos_token));
        for (size_t i = 0; ok && extra.t == TV_DICT && i < extra.u.d->n; i++)
            ok = tv_dict_set(&c.arena, &vars, extra.u.d->k[i], extra.u.d->v[i]);
        if (!ok || c.arena.failed) st = lm_error(LM_ERR_NO_MEMORY, "template: out of memory");
    }
    if (st == LM_OK) st = render(t, &c, vars, out, out_len);
    tmpl_arena_free(&c.arena);
    return st;
}

lm_status lm_template_render_chat(const lm_template *t, const char *messages_json, const char *tools_json,
                                  bool add_generation_prompt, const char *bos_token, const char *eos_token,
                                  const char *extra_context_json, char **out, size_t *out_len) {
    return lm_template_render_chat_ex(t, messages_json, tools_json, add_generation_prompt, bos_token, eos_token,
                                      extra_context_json, NULL, out, out_len);
}
