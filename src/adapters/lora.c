/* Reading LoRA adapters (MLX and PEFT layouts) into (layer, projection) factor pairs. */
#include "adapters/lora.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/hparams.h"
#include "tensor/quant.h"

static const char *const k_modules[LM_LORA_N_MODULES] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                          "gate_proj", "up_proj", "down_proj"};
#define SUPPORTED "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"

const char *lm_lora_module_name(lm_lora_module m) {
    return (unsigned)m < LM_LORA_N_MODULES ? k_modules[m] : "unknown";
}

bool lm_lora_module_from_name(const char *name, size_t len, lm_lora_module *out) {
    for (int i = 0; i < LM_LORA_N_MODULES; i++) {
        if (strlen(k_modules[i]) == len && memcmp(name, k_modules[i], len) == 0) {
            *out = (lm_lora_module)i;
            return true;
        }
    }
    return false;
}

void lm_lora_free(lm_lora *l) {
    if (!l) return;
    lm_safetensors_close(l->st);
    free(l->bytes);
    free(l->pairs);
    free(l);
}

/* ---- adapter_config.json ---------------------------------------------------------- */

/* A target name as configs write it ("q_proj", "self_attn.q_proj") must end in one of
 * the seven projections. */
static lm_status check_target(const char *target) {
    const char *dot = strrchr(target, '.');
    const char *last = dot ? dot + 1 : target;
    lm_lora_module m;
    if (!lm_lora_module_from_name(last, strlen(last), &m))
        return lm_error(LM_ERR_UNSUPPORTED, "adapter_config.json: unknown target module '%s' (supported: " SUPPORTED ")",
                        target);
    return LM_OK;
}

static lm_status check_targets(const cJSON *list, const char *key) {
    if (!list || cJSON_IsNull(list)) return LM_OK;
    if (cJSON_IsString(list)) {
        if (strcmp(list->valuestring, "all-linear") == 0) return LM_OK;
        return lm_error(LM_ERR_UNSUPPORTED,
                        "adapter_config.json: %s '%s' is a pattern; only a list of module names or \"all-linear\" is "
                        "supported",
                        key, list->valuestring);
    }
    if (!cJSON_IsArray(list)) return lm_error(LM_ERR_FORMAT, "adapter_config.json: %s is not a list", key);
    const cJSON *it;
    cJSON_ArrayForEach(it, list) {
        if (!cJSON_IsString(it)) return lm_error(LM_ERR_FORMAT, "adapter_config.json: %s holds a non-string", key);
        lm_status st = check_target(it->valuestring);
        if (st) return st;
    }
    return LM_OK;
}

static bool nonempty(const cJSON *v) {
    return v && !cJSON_IsNull(v) && !cJSON_IsFalse(v) && !(cJSON_IsObject(v) && !v->child) &&
           !(cJSON_IsArray(v) && !v->child);
}

/* Reads scale and the expected rank (0: not stated) from the config. */
static lm_status read_config(const char *json, float *scale, int64_t *rank) {
    cJSON *root = cJSON_Parse(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return lm_error(LM_ERR_FORMAT, "adapter_config.json is not a JSON object");
    }
    lm_status st = LM_OK;
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "lora_parameters");
    *rank = 0;
    if (cJSON_IsObject(lp)) { /* MLX */
        const cJSON *ft = cJSON_GetObjectItemCaseSensitive(root, "fine_tune_type");
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(lp, "rank");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(lp, "scale");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(lp, "alpha");
        if (cJSON_IsString(ft) && strcmp(ft->valuestring, "lora") != 0)
            st = lm_error(LM_ERR_UNSUPPORTED, "adapter_config.json: fine_tune_type '%s' is not supported (only lora)",
                          ft->valuestring);
        else if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > 65536)
            st = lm_error(LM_ERR_FORMAT, "adapter_config.json: lora_parameters.rank is missing or out of range");
        else if (!cJSON_IsNumber(s) && !cJSON_IsNumber(a))
            st = lm_error(LM_ERR_FORMAT, "adapter_config.json: lora_parameters has neither scale nor alpha");
        else {
            *rank = (int64_t)r->valuedouble;
            *scale = cJSON_IsNumber(s) ? (float)s->valuedouble : (float)(a->valuedouble / r->valuedouble);
            st = check_targets(cJSON_GetObjectItemCaseSensitive(lp, "keys"), "lora_parameters.keys");
        }
    } else { /* PEFT */
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "r");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "use_rslora");
        if (cJSON_IsString(pt) && strcmp(pt->valuestring, "LORA") != 0)
            st = lm_error(LM_ERR_UNSUPPORTED, "adapter_config.json: peft_type '%s' is not supported (only LORA)",
                          pt->valuestring);
        else if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > 65536)
            st = lm_error(LM_ERR_FORMAT, "adapter_config.json has neither lora_parameters (MLX) nor a valid r (PEFT)");
        else if (!cJSON_IsNumber(a))
            st = lm_error(LM_ERR_FORMAT, "adapter_config.json: lora_alpha is missing");
        else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "use_dora")))
            st = lm_error(LM_ERR_UNSUPPORTED, "adapter_config.json: DoRA adapters (use_dora) are not supported");
        else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "fan_in_fan_out")))
            st = lm_error(LM_ERR_UNSUPPORTED, "adapter_config.json: fan_in_fan_out adapters are not supported");
        else if (nonempty(cJSON_GetObjectItemCaseSensitive(root, "rank_pattern")) ||
                 nonempty(cJSON_GetObjectItemCaseSensitive(root, "alpha_pattern")))
            st = lm_error(LM_ERR_UNSUPPORTED, "adapter_config.json: per-module rank_pattern/alpha_pattern is not "
                                              "supported");
        else if (nonempty(cJSON_GetObjectItemCaseSensitive(root, "modules_to_save")))
            st = lm_error(LM_ERR_UNSUPPORTED, "adapter_config.json: modules_to_save (fully trained modules) is not "
                                              "supported");
        else {
            *rank = (int64_t)r->valuedouble;
            double alpha = a->valuedouble;
            *scale = (float)(cJSON_IsTrue(rs) ? alpha / sqrt((double)*rank) : alpha / (double)*rank);
            st = check_targets(cJSON_GetObjectItemCaseSensitive(root, "target_modules"), "target_modules");
        }
    }
    if (!st && !isfinite(*scale)) st = lm_error(LM_ERR_FORMAT, "adapter_config.json: the LoRA scale is not finite");
    cJSON_Delete(root);
    return st;
}

/* ---- tensor names ------------------------------------------------------------------- */

typedef struct parsed_name {
    int layer;
    lm_lora_module module;
    bool is_b;
    lm_lora_layout layout;
} parsed_name;

static bool ends_with(const char *s, size_t n, const char *suffix, size_t *stem) {
    size_t k = strlen(suffix);
    if (n < k || memcmp(s + n - k, suffix, k) != 0) return false;
    *stem = n - k;
    return true;
}

static lm_status parse_name(const char *name, parsed_name *out) {
    size_t n = strlen(name), stem;
    if (ends_with(name, n, ".lora_a", &stem)) out->layout = LM_LORA_LAYOUT_MLX, out->is_b = false;
    else if (ends_with(name, n, ".lora_b", &stem)) out->layout = LM_LORA_LAYOUT_MLX, out->is_b = true;
    else if (ends_with(name, n, ".lora_A.weight", &stem)) out->layout = LM_LORA_LAYOUT_PEFT, out->is_b = false;
    else if (ends_with(name, n, ".lora_B.weight", &stem)) out->layout = LM_LORA_LAYOUT_PEFT, out->is_b = true;
    else
        return lm_error(LM_ERR_UNSUPPORTED,
                        "adapter tensor '%s' is not a LoRA factor (names end in .lora_a/.lora_b or "
                        ".lora_A.weight/.lora_B.weight)",
                        name);
    /* the projection is the last dotted component of the stem */
    size_t m0 = stem;
    while (m0 > 0 && name[m0 - 1] != '.') m0--;
    if (!lm_lora_module_from_name(name + m0, stem - m0, &out->module))
        return lm_error(LM_ERR_UNSUPPORTED, "adapter tensor '%s' targets unknown module '%.*s' (supported: " SUPPORTED ")",
                        name, (int)(stem - m0), name + m0);
    /* the layer: "layers.N." somewhere before it */
    const char *p = name, *hit = NULL;
    while ((p = strstr(p, "layers.")) && p < name + m0) {
        if ((p == name || p[-1] == '.') && isdigit((unsigned char)p[7])) hit = p + 7;
        p += 7;
    }
    if (!hit) return lm_error(LM_ERR_UNSUPPORTED, "adapter tensor '%s' names no layer (\"layers.N.\")", name);
    long layer = 0;
    while (isdigit((unsigned char)*hit) && layer <= LM_MAX_LAYERS) layer = layer * 10 + (*hit++ - '0');
    if (*hit != '.' || layer >= LM_MAX_LAYERS)
        return lm_error(LM_ERR_FORMAT, "adapter tensor '%s' has a bad layer index", name);
    out->layer = (int)layer;
    return LM_OK;
}

static int cmp_pair(const void *a, const void *b) {
    const lm_lora_pair *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return (int)x->module - (int)y->module;
}

lm_status lm_lora_open(uint8_t *bytes, size_t len, const char *config_json, lm_lora **out) {
    *out = NULL;
    lm_lora *l = calloc(1, sizeof *l);
    if (!l) {
        free(bytes);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    }
    l->bytes = bytes;
    lm_status st;
    int64_t cfg_rank = 0;
    if (!config_json) {
        st = lm_error(LM_ERR_NOT_FOUND, "the adapter carries no adapter_config.json, so its scale is unknown (encode "
                                        "the adapter folder, not the bare .safetensors file)");
        goto fail;
    }
    if ((st = read_config(config_json, &l->scale, &cfg_rank))) goto fail;
    if ((st = lm_safetensors_open_memory(bytes, len, &l->st))) goto fail;
    int64_t nt = lm_safetensors_n_tensors(l->st);
    if (nt == 0) {
        st = lm_error(LM_ERR_FORMAT, "adapter has no tensors");
        goto fail;
    }
    /* slot per (layer, module): index into pairs + 1 */
    int32_t *slot = calloc((size_t)LM_MAX_LAYERS * LM_LORA_N_MODULES, sizeof *slot);
    l->pairs = calloc((size_t)nt, sizeof *l->pairs);
    if (!slot || !l->pairs) {
        free(slot);
        st = lm_error(LM_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < nt && !st; i++) {
        const lm_tensor *t = lm_safetensors_tensor(l->st, i);
        parsed_name pn = {0};
        if ((st = parse_name(t->name, &pn))) break;
        if (i == 0) l->layout = pn.layout;
        else if (pn.layout != l->layout) {
            st = lm_error(LM_ERR_FORMAT, "adapter mixes MLX (.lora_a) and PEFT (.lora_A.weight) tensor names ('%s')",
                          t->name);
            break;
        }
        if (t->type != LM_DTYPE_F32 && t->type != LM_DTYPE_F16 && t->type != LM_DTYPE_BF16) {
            st = lm_error(LM_ERR_UNSUPPORTED, "adapter tensor '%s' has dtype %s; LoRA factors must be F32, F16 or BF16",
                          t->name, lm_dtype_name(t->type));
            break;
        }
        if (t->n_dims != 2) {
            st = lm_error(LM_ERR_FORMAT, "adapter tensor '%s' has %d dimensions; LoRA factors are matrices", t->name,
                          t->n_dims);
            break;
        }
        int32_t *s = &slot[pn.layer * LM_LORA_N_MODULES + pn.module];
        if (!*s) {
            lm_lora_pair *p = &l->pairs[l->n_pairs++];
            p->layer = pn.layer;
            p->module = pn.module;
            *s = (int32_t)l->n_pairs;
        }
        lm_lora_pair *p = &l->pairs[*s - 1];
        const lm_tensor **dst = pn.is_b ? &p->b : &p->a;
        if (*dst) {
            st = lm_error(LM_ERR_FORMAT, "adapter has two %s factors for layer %d %s ('%s')", pn.is_b ? "B" : "A",
                          pn.layer, k_modules[pn.module], t->name);
            break;
        }
        *dst = t;
    }
    free(slot);
    if (st) goto fail;
    for (int64_t i = 0; i < l->n_pairs; i++) {
        lm_lora_pair *p = &l->pairs[i];
        if (!p->a || !p->b) {
            st = lm_error(LM_ERR_FORMAT, "adapter tensor '%s' has no matching %s factor",
                          (p->a ? p->a : p->b)->name, p->a ? "B" : "A");
            goto fail;
        }
        /* ne[] is the file shape reversed */
        int64_t ra, rb;
        if (l->layout == LM_LORA_LAYOUT_MLX) { /* a [in, r], b [r, out] */
            p->in = p->a->ne[1], ra = p->a->ne[0];
            rb = p->b->ne[1], p->out = p->b->ne[0];
        } else { /* A [r, in], B [out, r] */
            ra = p->a->ne[1], p->in = p->a->ne[0];
            p->out = p->b->ne[1], rb = p->b->ne[0];
        }
        if (ra != rb || ra <= 0 || (cfg_rank && ra != cfg_rank)) {
            st = lm_error(LM_ERR_FORMAT,
                          "adapter factors '%s' and '%s' disagree on the rank (%lld vs %lld; adapter_config.json says "
                          "%lld)",
                          p->a->name, p->b->name, (long long)ra, (long long)rb, (long long)cfg_rank);
            goto fail;
        }
        p->rank = ra;
        if (p->layer > l->max_layer) l->max_layer = p->layer;
    }
    qsort(l->pairs, (size_t)l->n_pairs, sizeof *l->pairs, cmp_pair);
    *out = l;
    return LM_OK;
fail:
    lm_lora_free(l);
    return st;
}

const lm_lora_pair *lm_lora_find(const lm_lora *l, int layer, lm_lora_module module) {
    lm_lora_pair key = {.layer = layer, .module = module};
    return bsearch(&key, l->pairs, (size_t)l->n_pairs, sizeof key, cmp_pair);
}

static void to_f32(const lm_tensor *t, float *dst) {
    lm_dequantize_row(t->type, t->data, dst, lm_tensor_nelements(t));
}

void lm_lora_apply(const lm_lora *l, const lm_lora_pair *p, float *w, float *scratch) {
    int64_t r = p->rank, in = p->in, out = p->out;
    float *A = scratch;          /* [r][in]  */
    float *B = scratch + r * in; /* [out][r] */
    if (l->layout == LM_LORA_LAYOUT_PEFT) {
        to_f32(p->a, A);
        to_f32(p->b, B);
    } else {
        /* MLX stores the transposes, a [in][r] and b [r][out]: transpose while converting */
        for (int64_t i = 0; i < in; i++) {
            float row[512];
            const uint8_t *src = (const uint8_t *)p->a->data;
            size_t es = lm_dtype_get_info(p->a->type)->block_bytes;
            for (int64_t k0 = 0; k0 < r; k0 += 512) {
                int64_t nk = r - k0 < 512 ? r - k0 : 512;
                lm_dequantize_row(p->a->type, src + ((size_t)(i * r + k0)) * es, row, nk);
                for (int64_t k = 0; k < nk; k++) A[(k0 + k) * in + i] = row[k];
            }
        }
        for (int64_t k = 0; k < r; k++) {
            const uint8_t *src = (const uint8_t *)p->b->data;
            size_t es = lm_dtype_get_info(p->b->type)->block_bytes;
            for (int64_t o0 = 0; o0 < out; o0 += 512) {
                float row[512];
                int64_t no = out - o0 < 512 ? out - o0 : 512;
                lm_dequantize_row(p->b->type, src + ((size_t)(k * out + o0)) * es, row, no);
                for (int64_t o = 0; o < no; o++) B[(o0 + o) * r + k] = row[o];
            }
        }
    }
    float scale = l->scale;
    for (int64_t o = 0; o < out; o++) {
        float *wr = w + o * in;
        for (int64_t k = 0; k < r; k++) {
            float s = scale * B[o * r + k];
            const float *ar = A + k * in;
            for (int64_t i = 0; i < in; i++) wr[i] += s * ar[i];
        }
    }
}
