// Rows that a pack does not divide (4097 values, say), in packs all the same. The
// softmax chapter's cluster kernel (softmax.cu) and the LayerNorm chapter's
// (layernorm.cu) take their rows this way.
#pragma once

// Row r starts at element r * cols. Unless the pack divides cols, that start
// wanders through the pack: yet every row has an aligned middle. Its first HEAD
// values (fewer than a pack) run up to the first address a pack may start at; the
// middle is whole packs; the TAIL (fewer than a pack again) is what is left. The
// middle travels in packs like any row, and the head and the tail, at most
// 2 * (PackSize - 1) values, go one to a thread, to the first threads of the row's
// first block. Without Edges the row is all middle (head 0, no edge values), and the
// compiler drops every line about the edges.
//
// most_middle: the most values the middle of a row with a head may hold (a multiple of
// PackSize; -1, the default: no limit); the values past it are then edge values too,
// at most 2 * PackSize - 1 in all. LayerNorm passes it so that a shifted middle's
// reads of weight and bias stay inside them (layernorm.cu); softmax has no such reads.
template <int PackSize, bool Edges>
struct RowEdges {
    long long head = 0;         // values before the middle
    long long middle_cols = 0;  // a multiple of PackSize
    long long col = -1;         // the column of this thread's edge value, or -1
    __device__ RowEdges(long long row, long long cols, bool first_block, long long most_middle = -1) {
        if constexpr (Edges) {
            head = min(cols, (-(row * cols)) & (PackSize - 1));  // x and y are aligned: so is column head
            middle_cols = (cols - head) / PackSize * PackSize;
            if (most_middle >= 0 && head > 0) middle_cols = max(0LL, min(middle_cols, most_middle));
            const long long t = threadIdx.x;
            if (first_block && t < cols - middle_cols) col = t < head ? t : t + middle_cols;
        } else {
            middle_cols = cols;
        }
    }
};
