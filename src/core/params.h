/* params.h — validation of attention parameters (core only). */
#ifndef FI_CORE_PARAMS_H
#define FI_CORE_PARAMS_H

#include "core/internal.h"

/* FI_OK, or a status and message naming the first bad field. */
fi_status fi_params_validate(const fi_attention_params *params);
/* The same for a plan's config against its (valid) params (plan.c). */
fi_status fi_plan_config_validate(const fi_plan_config *config,
                                  const fi_attention_params *params);

#endif
