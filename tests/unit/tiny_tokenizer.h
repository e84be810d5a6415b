/* A tiny GPT-2-style byte-level tokenizer and a ChatML template for the tiny test
 * models (tiny_model.h): written into a GGUF through tiny_write_gguf_ex's metadata
 * hook, so the public API can load such a model with a working tokenizer. */
#ifndef LM_TEST_TINY_TOKENIZER_H
#define LM_TEST_TINY_TOKENIZER_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/gguf.h"

enum { N_BYTES = 256, TOK_EOT = 256, TOK_IM_START = 257, TOK_IM_END = 258, TOK_T = 259, N_VOCAB = 260 };

static const char *k_template =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/* GPT-2's byte alphabet: byte b is the code point b if printable, else 256 + n */
static inline void byte_token(int b, char *out) {
    int n = 0, cp = -1;
    for (int x = 0; x < 256; x++) {
        bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
        int c = printable ? x : 256 + n++;
        if (x == b) cp = c;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = '\0';
    }
}

static inline void add_tokenizer(lm_gguf_writer *w, void *user) {
    (void)user;
    static char bytes[N_BYTES][4];
    const char *tokens[N_VOCAB];
    int32_t types[N_VOCAB];
    for (int b = 0; b < N_BYTES; b++) {
        byte_token(b, bytes[b]);
        tokens[b] = bytes[b];
        types[b] = 1;
    }
    tokens[TOK_EOT] = "<|endoftext|>";
    tokens[TOK_IM_START] = "<|im_start|>";
    tokens[TOK_IM_END] = "<|im_end|>";
    types[TOK_EOT] = types[TOK_IM_START] = types[TOK_IM_END] = 3;
    tokens[TOK_T] = "\xC4\xA0t"; /* "Ġt" = " t" */
    types[TOK_T] = 1;
    const char *merges[] = {"\xC4\xA0 t"};
    lm_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    lm_gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2");
    lm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, N_VOCAB);
    lm_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", LM_GGUF_I32, types, N_VOCAB);
    lm_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    lm_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", TOK_EOT);
    lm_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", TOK_IM_END);
    lm_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    lm_gguf_writer_set_str(w, "tokenizer.chat_template", k_template);
}

static char g_dir[256], g_path[512];

#endif
