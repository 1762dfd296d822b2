// The rules every executor shares, by concept: include the one you need.
//   sequence.h    a batch's sequence (Sequence, sequence_of, query_row_index)
//   visibility.h  which keys a row sees (first_visible_key, visible_key_end, key_visible)
//   split_kv.h    split-KV's parts and their scratch
//   score_bias.h  ALiBi's and attn_mask's additions to a logit, attn_mask's tile classes
// This header includes all four, for the files that use several.
#pragma once
#include "score_bias.h"
#include "sequence.h"
#include "split_kv.h"
#include "visibility.h"
