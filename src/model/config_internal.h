/*
 * config_internal.h - what the config builders (config_gguf.c, config_hf.c, config_llama2c.c)
 * share from config.c; not part of the model API.
 */
#ifndef KILN_MODEL_CONFIG_INTERNAL_H
#define KILN_MODEL_CONFIG_INTERNAL_H

#include "model/config.h"

/** Reset cfg to the source-independent defaults every builder starts from: zeroes, Llama,
 *  RMSNorm eps 1e-5, rope theta 10000 adjacent-pair unscaled, embedding scale 1, gated SiLU
 *  FFN, no BOS/EOS (-1). */
void kiln_config_defaults(kiln_model_config *cfg);

/** Fill derived defaults: rope_dim, score divisor, local theta. */
void kiln_config_finish(kiln_model_config *cfg);

#endif
