/* The content-addressed fuser: base model + compressed LoRA adapter -> a merged
 * Hugging Face model folder in the hub cache, keyed by the adapter's digest.
 *
 *   W' = W + scale * B·A   for every weight the adapter targets (quantized bases are
 *                          dequantized to f32 first; the sum is formed in f32)
 *
 * Output: $HF_HUB_CACHE/models--{ns}-{digest}/snapshots/{digest}/ (ns "org/name" gives
 * models--org--name-{digest}; the repo id is "{ns}-{digest}") with
 *   config.json   the base's own (folder base), or derived from the GGUF hyperparameters
 *                 in the form lm_hparams_from_config_json reads back;
 *   model.safetensors, or model-0000i-of-0000n.safetensors + model.safetensors.index.json
 *                 when the weights exceed params.shard_bytes; Hugging Face tensor names
 *                 and layout (GGUF llama Q/K rows are put back into the NeoX order the
 *                 HF layout uses; GGUF Gemma norms get their +1 removed);
 *   tokenizer and generation files copied from a folder base (*.json, *.txt, *.model,
 *                 *.jinja). A GGUF base's tokenizer lives in its metadata and is not
 *                 exported yet: the folder then has no tokenizer files.
 *   lumen_fuse.json  provenance: base path, adapter digest, layout, scale, dtype.
 *   ../../refs/main  the digest, so repo-id lookups find the snapshot.
 * Everything is written under a temporary folder in the hub directory and renamed into
 * place as a whole, so an interrupted or failed fuse leaves nothing that looks like a
 * model; the temporary folder is removed on failure.
 *
 * Cache: when the snapshot already exists the call returns at once, without opening
 * the base (result.cached, result.base_tensors_read == 0). Two racing fusers of the
 * same adapter both succeed; one rename wins.
 *
 * The base is a path (GGUF file or HF folder), a name pulled with `lumen pull`, or a
 * repo id in the hub cache; when none matches, the error lists the three places. */
#ifndef LM_ADAPTERS_FUSE_H
#define LM_ADAPTERS_FUSE_H

#include <stdbool.h>
#include <stdint.h>

#include "adapters/codec.h"
#include "lumen.h"

/* Called after each output tensor: bytes produced so far of the total. Returning
 * false cancels the fuse (LM_ERR_INVALID_ARG, "cancelled"; nothing is left behind). */
typedef bool (*lm_fuse_progress_fn)(void *user, uint64_t done_bytes, uint64_t total_bytes);

typedef struct lm_fuse_params {
    const char *namespace_name;  /* required: "name" or "org/name" ([A-Za-z0-9._-])      */
    const char *expected_digest; /* NULL: no check; else the adapter must have this digest */
    int out_dtype;               /* -1: the base's float dtype per tensor (BF16 for a
                                  * quantized GGUF base); or LM_DTYPE_F32/F16/BF16        */
    uint64_t shard_bytes;        /* largest safetensors shard; 0: 2 GiB                    */
    lm_fuse_progress_fn progress;
    void *progress_user;
} lm_fuse_params;

lm_fuse_params lm_fuse_default_params(void);

typedef struct lm_fuse_result {
    char path[4096];   /* the snapshot folder (loadable by lm_model_internal_load)   */
    char repo_id[320]; /* "{ns}-{digest}"                                            */
    char digest[LM_ADAPTER_DIGEST_LEN + 1];
    bool cached;                /* the snapshot existed; nothing was read or written */
    int64_t base_tensors_read;  /* base tensors whose data this call read            */
    int64_t weights_adapted;    /* weights that received a LoRA delta                */
} lm_fuse_result;

/* `adapter`: a compressed adapter file (lm_adapter_encode; it must carry its
 * adapter_config.json) or an uncompressed adapter folder, which is encoded in memory
 * first so that it gets the same digest as its compressed file. */
lm_status lm_adapter_fuse(const char *base, const char *adapter, const lm_fuse_params *params,
                          lm_fuse_result *out);

/* Where `base` resolves (path, pulled name, or hub repo id); LM_ERR_NOT_FOUND lists
 * every place it looked. */
lm_status lm_fuse_resolve_base(const char *base, char *buf, size_t cap);

#endif
