#include <stdio.h>
#include <string.h>

#include "lumen.h"

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("lumen %s\n", lm_version());
        return 0;
    }
    fprintf(stderr, "usage: lumen COMMAND ...\n");
    return 2;
}
