/* Where models live on disk: the `lumen pull` cache ($LUMEN_HOME/models/NAME/FILE,
 * LUMEN_HOME defaulting to ~/.cache/lumen) and plain paths. */
#ifndef LM_FORMATS_MODEL_STORE_H
#define LM_FORMATS_MODEL_STORE_H

#include "lumen.h"

/* Writes $LUMEN_HOME (or ~/.cache/lumen) into buf. Returns the needed length. */
size_t lm_model_store_home(char *buf, size_t cap);

/* Resolves `spec`: an existing file or folder is returned as is; otherwise a name
 * pulled into the store (a folder $LUMEN_HOME/models/spec holding one .gguf file, or
 * a Hugging Face folder with config.json); otherwise a repo id ("org/name") in the
 * Hugging Face cache layout (formats/hub.h: its snapshot folder, or the snapshot's
 * .gguf file). LM_ERR_NOT_FOUND names where it looked. */
lm_status lm_model_store_resolve(const char *spec, char *buf, size_t cap);

#endif
