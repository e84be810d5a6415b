#include "formats/hub.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"

size_t lm_hub_dir(char *buf, size_t cap) {
    const char *hub = getenv("HF_HUB_CACHE"), *home = getenv("HF_HOME");
    int n;
    if (hub && *hub)
        n = snprintf(buf, cap, "%s", hub);
    else if (home && *home)
        n = snprintf(buf, cap, "%s/hub", home);
    else
        n = snprintf(buf, cap, "%s/.cache/huggingface/hub", getenv("HOME") ? getenv("HOME") : ".");
    return n < 0 ? 0 : (size_t)n + 1;
}

bool lm_hub_repo_id_valid(const char *id) {
    if (!id || !*id || strlen(id) > 200 || strstr(id, "--")) return false;
    int slashes = 0;
    bool start = true;
    for (const char *p = id; *p; p++) {
        char c = *p;
        if (c == '/') {
            if (start || ++slashes > 1) return false;
            start = true;
            continue;
        }
        if (start && (c == '.' || c == '-')) return false;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return false;
        start = false;
    }
    return !start;
}

bool lm_hub_repo_folder(const char *id, char *buf, size_t cap) {
    if (!lm_hub_repo_id_valid(id)) return false;
    size_t o = 0;
    const char *prefix = "models--";
    for (const char *p = prefix; *p; p++) {
        if (o + 1 >= cap) return false;
        buf[o++] = *p;
    }
    for (const char *p = id; *p; p++) {
        const char *rep = *p == '/' ? "--" : NULL;
        size_t k = rep ? 2 : 1;
        if (o + k >= cap) return false;
        if (rep)
            buf[o++] = '-', buf[o++] = '-';
        else
            buf[o++] = *p;
    }
    buf[o] = '\0';
    return true;
}

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A snapshot folder's model: the folder if it has config.json, else its .gguf file. */
static bool snapshot_model(const char *snap, char *buf, size_t cap) {
    char p[4400];
    snprintf(p, sizeof p, "%s/config.json", snap);
    if (is_file(p)) return (size_t)snprintf(buf, cap, "%s", snap) < cap;
    DIR *d = opendir(snap);
    if (!d) return false;
    struct dirent *e;
    bool ok = false;
    while (!ok && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (e->d_name[0] != '.' && n > 5 && strcmp(e->d_name + n - 5, ".gguf") == 0)
            ok = (size_t)snprintf(buf, cap, "%s/%s", snap, e->d_name) < cap;
    }
    closedir(d);
    return ok;
}

lm_status lm_hub_resolve(const char *repo_id, char *buf, size_t cap) {
    char hub[2048], folder[512], repo[4096], snap[4700];
    lm_hub_dir(hub, sizeof hub);
    if (!lm_hub_repo_folder(repo_id, folder, sizeof folder))
        return lm_error(LM_ERR_INVALID_ARG, "'%s' is not a valid repo id (org/name)", repo_id ? repo_id : "(null)");
    snprintf(repo, sizeof repo, "%s/%s", hub, folder);
    char ref[4200];
    snprintf(ref, sizeof ref, "%s/refs/main", repo);
    FILE *f = fopen(ref, "r");
    if (f) {
        char hash[128] = "";
        bool got = fgets(hash, sizeof hash, f) != NULL;
        fclose(f);
        hash[strcspn(hash, "\r\n")] = '\0';
        bool clean = got && hash[0] && !strchr(hash, '/') && hash[0] != '.';
        if (clean) {
            snprintf(snap, sizeof snap, "%s/snapshots/%s", repo, hash);
            if (snapshot_model(snap, buf, cap)) return LM_OK;
        }
    }
    char snaps[4200];
    snprintf(snaps, sizeof snaps, "%s/snapshots", repo);
    DIR *d = opendir(snaps);
    if (!d) return lm_error(LM_ERR_NOT_FOUND, "repo '%s' is not in the Hugging Face cache (no %s)", repo_id, snaps);
    char best[256] = "";
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof best) continue;
        snprintf(snap, sizeof snap, "%s/%s", snaps, e->d_name);
        char tmp[4800];
        if (!snapshot_model(snap, tmp, sizeof tmp)) continue;
        if (!best[0] || strcmp(e->d_name, best) < 0) snprintf(best, sizeof best, "%s", e->d_name);
    }
    closedir(d);
    if (!best[0])
        return lm_error(LM_ERR_NOT_FOUND, "repo '%s': no snapshot in %s holds config.json or a .gguf file", repo_id,
                        snaps);
    snprintf(snap, sizeof snap, "%s/%s", snaps, best);
    if (!snapshot_model(snap, buf, cap)) return lm_error(LM_ERR_LIMIT, "model path is too long");
    return LM_OK;
}
