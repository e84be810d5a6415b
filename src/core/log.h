#ifndef LM_CORE_LOG_H
#define LM_CORE_LOG_H

#include "core/error.h"

void lm_log(lm_log_level level, const char *fmt, ...) LM_PRINTF(2, 3);

#endif
