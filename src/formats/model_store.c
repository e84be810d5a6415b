#include "formats/model_store.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "formats/hub.h"

size_t lm_model_store_home(char *buf, size_t cap) {
    const char *home = getenv("LUMEN_HOME");
    int n;
    if (home && *home)
        n = snprintf(buf, cap, "%s", home);
    else
        n = snprintf(buf, cap, "%s/.cache/lumen", getenv("HOME") ? getenv("HOME") : ".");
    return n < 0 ? 0 : (size_t)n + 1;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

lm_status lm_model_store_resolve(const char *spec, char *buf, size_t cap) {
    if (!spec || !*spec) return lm_error(LM_ERR_INVALID_ARG, "empty model name");
    struct stat st;
    if (stat(spec, &st) == 0) {
        if ((size_t)snprintf(buf, cap, "%s", spec) >= cap) return lm_error(LM_ERR_LIMIT, "model path is too long");
        return LM_OK;
    }
    if (strchr(spec, '/') || strcmp(spec, "..") == 0 || strcmp(spec, ".") == 0) {
        /* "org/name": a repo id in the Hugging Face cache layout */
        if (!lm_hub_repo_id_valid(spec)) return lm_error(LM_ERR_NOT_FOUND, "model path %s does not exist", spec);
        if (lm_hub_resolve(spec, buf, cap) == LM_OK) return LM_OK;
        char hub[2048];
        lm_hub_dir(hub, sizeof hub);
        return lm_error(LM_ERR_NOT_FOUND, "model %s: no such path, and no such repo in the Hugging Face cache (%s)",
                        spec, hub);
    }
    char home[2048], dir[4096];
    lm_model_store_home(home, sizeof home);
    snprintf(dir, sizeof dir, "%s/models/%s", home, spec);
    DIR *d = opendir(dir);
    if (!d && lm_hub_repo_id_valid(spec) && lm_hub_resolve(spec, buf, cap) == LM_OK) return LM_OK; /* "name" repo */
    if (!d)
        return lm_error(LM_ERR_NOT_FOUND, "no model '%s': not a path, and not in %s/models (run `lumen pull %s`)",
                        spec, home, spec);
    char found[1024] = "";
    struct dirent *e;
    while ((e = readdir(d))) {
        if (ends_with(e->d_name, ".gguf") && e->d_name[0] != '.') {
            snprintf(found, sizeof found, "%s", e->d_name);
            break;
        }
    }
    closedir(d);
    if (found[0]) {
        if ((size_t)snprintf(buf, cap, "%s/%s", dir, found) >= cap) return lm_error(LM_ERR_LIMIT, "model path is too long");
        return LM_OK;
    }
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    if (stat(cfg, &st) == 0) {
        if ((size_t)snprintf(buf, cap, "%s", dir) >= cap) return lm_error(LM_ERR_LIMIT, "model path is too long");
        return LM_OK;
    }
    return lm_error(LM_ERR_NOT_FOUND, "%s holds neither a .gguf file nor config.json", dir);
}
