/* lumen: the command-line tool. Each subcommand lives in tools/cmd_<name>.c. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "lumen.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} k_commands[] = {
    {"pull", cmd_pull, "download a model into the local store (default: smollm2-135m)"},
    {"inspect", cmd_inspect, "show a model's architecture, hyperparameters and tensors"},
    {"run", cmd_run, "generate text from a prompt (streamed; sampling options; --json)"},
    {"chat", cmd_chat, "chat interactively with a model (multi-turn; /reset, /exit)"},
    {"tokenize", cmd_tokenize, "show the token ids and pieces of a text"},
    {"convert", cmd_convert, "write a GGUF as a Hugging Face folder (bf16 safetensors, tokenizer.json, config.json)"},
    {"bench", cmd_bench, "measure prompt-processing and generation speed"},
    {"adapter", cmd_adapter, "compress, restore and identify LoRA adapters (encode|decode|digest|dtype)"},
    {"fuse", cmd_fuse, "merge a LoRA adapter into a base model, cached in the Hugging Face layout"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: lumen COMMAND [options]   (lumen COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(f, "  %-10s %s\n", k_commands[i].name, k_commands[i].help);
    fprintf(f, "  --version  print the version\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("lumen %s\n", lm_version());
        return 0;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (strcmp(argv[1], k_commands[i].name) == 0) return k_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "lumen: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
