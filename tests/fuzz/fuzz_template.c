/* libFuzzer target: the input is template source; it is parsed and, when it parses, rendered on a
 * fixed conversation (system, user, assistant with a tool call, tool result) with a tools list and
 * tight limits, so runaway loops and growth stop quickly. Any crash, leak or sanitizer report is a
 * bug; errors are expected and ignored. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "tokenizer/template/template.h"

static const char *const kMessages =
    "[{\"role\":\"system\",\"content\":\"  Be brief.\\n\"},"
    "{\"role\":\"user\",\"content\":\"H\\u00e9llo \\ud83d\\ude80 <tag> & \\\"q\\\"\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call0wx9z\",\"type\":\"function\","
    "\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":3,\"temp\":21.5}}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call0wx9z\",\"content\":\"sunny\"},"
    "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"It is sunny.\"}]}]";

static const char *const kTools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather.\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 64 << 10) return 0;
    lm_template *t = NULL;
    if (lm_template_parse((const char *)data, size, &t) != LM_OK) return 0;
    lm_template_limits lim = {.max_output = 1 << 16, .max_memory = 16 << 20, .max_steps = 200000, .max_depth = 16,
                              .now = 1741356309};
    char *out = NULL;
    size_t n = 0;
    lm_template_render_chat_ex(t, kMessages, kTools, true, "<s>", "</s>", "{\"enable_thinking\":true}", &lim, &out, &n);
    free(out);
    lm_template_render_chat_ex(t, "[]", NULL, false, NULL, NULL, NULL, &lim, &out, &n);
    free(out);
    lm_template_free(t);
    return 0;
}
