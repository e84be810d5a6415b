/* The Hugging Face hub cache layout, as the fuser writes it and every command reads it
 * (formats/model_store.c resolves repo ids through lm_hub_resolve):
 *
 *   $HF_HUB_CACHE (or $HF_HOME/hub, HF_HOME defaulting to ~/.cache/huggingface)
 *     models--{org}--{name}/refs/main          the snapshot hash of "main"
 *     models--{org}--{name}/snapshots/{hash}/  config.json, *.safetensors, tokenizer files
 *
 * A repo id is "name" or "org/name" made of [A-Za-z0-9._-], no component starting
 * with '.' and no "--" (which the folder name uses as the separator). */
#ifndef LM_FORMATS_HUB_H
#define LM_FORMATS_HUB_H

#include <stdbool.h>
#include <stddef.h>

#include "lumen.h"

/* Writes the hub folder into buf; returns the needed length (with the NUL). */
size_t lm_hub_dir(char *buf, size_t cap);

bool lm_hub_repo_id_valid(const char *repo_id);

/* "models--org--name" for "org/name"; false if the id is invalid or buf too small. */
bool lm_hub_repo_folder(const char *repo_id, char *buf, size_t cap);

/* The snapshot of `repo_id` in the cache: refs/main's snapshot when present, else the
 * only (or the lexically first) snapshot holding config.json or a .gguf file. A
 * snapshot that holds a .gguf file and no config.json resolves to that file.
 * LM_ERR_NOT_FOUND naming the folder it looked in. */
lm_status lm_hub_resolve(const char *repo_id, char *buf, size_t cap);

#endif
