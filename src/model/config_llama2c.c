/* config_llama2c.c - kiln_config_from_llama2c: the config a llama2.c checkpoint header implies. */
#include "model/config.h"

#include "model/config_internal.h"

void kiln_config_from_llama2c(const kiln_llama2c_config *c, kiln_model_config *cfg) {
    kiln_config_defaults(cfg);
    cfg->source = KILN_SOURCE_LLAMA2C;
    cfg->n_vocab = c->vocab_size;
    cfg->n_embd = c->dim;
    cfg->n_layer = c->n_layers;
    cfg->n_head = c->n_heads;
    cfg->n_head_kv = c->n_kv_heads;
    cfg->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
    cfg->n_ff = c->hidden_dim;
    cfg->n_ctx_train = c->seq_len;
    cfg->tied_embeddings = c->shared_classifier;
    cfg->bos_id = 1; /* run.c: BOS=1, EOS=2 */
    cfg->eos_id = 2;
    kiln_config_finish(cfg);
}
