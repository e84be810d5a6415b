/* The engine's public declarations are in include/lumen.h (section "the engine");
 * this header remains for the engine's own files and tests. */
#ifndef LM_ENGINE_ENGINE_H
#define LM_ENGINE_ENGINE_H

#include "lumen.h"

#endif
