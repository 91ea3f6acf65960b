/* Conversion profiles: a catalog rewritten for one consumer's conventions (convert --profile). */
#ifndef CKPT_PROFILE_H
#define CKPT_PROFILE_H

#include "ckpt.h"

/* HF GPT-2 -> LightwatchAI2 .lwt names, layout and header (see profile_lightwatch.c). */
int ckpt_profile_lightwatch_gpt2(const ckpt_catalog *in, ckpt_catalog **out, ckpt_err *err);

#endif
