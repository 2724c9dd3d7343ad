// Window update on append: write each valid stream token into its slot's ring and raise
// the slot's last_pos[token] to the token's stream position. One thread per token;
// atomicMax makes duplicates of a token within a batch resolve to the latest position.
#include <cstdint>
#include <cuda_runtime.h>

namespace {

__global__ void window_append_kernel(int64_t* ring, int32_t* last_pos, const int64_t* slots,
                                     const int64_t* tokens, const int64_t* positions,
                                     const bool* valid, const bool* in_ring, int64_t batch,
                                     int64_t length, int64_t ring_stride, int64_t w_cap,
                                     int64_t vocab_stride) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= batch * length || !valid[i]) return;
  const int64_t slot = slots[i / length];
  const int64_t token = tokens[i];
  const int64_t position = positions[i];
  if (in_ring[i]) ring[slot * ring_stride + position % w_cap] = token;
  atomicMax(last_pos + slot * vocab_stride + token, static_cast<int32_t>(position));
}

}  // namespace

void launch_window_append(int64_t* ring, int32_t* last_pos, const int64_t* slots,
                          const int64_t* tokens, const int64_t* positions, const bool* valid,
                          const bool* in_ring, int64_t batch, int64_t length,
                          int64_t ring_stride, int64_t w_cap, int64_t vocab_stride,
                          cudaStream_t stream) {
  const int64_t total = batch * length;
  if (total == 0) return;
  const int threads = 256;
  const int64_t blocks = (total + threads - 1) / threads;
  window_append_kernel<<<blocks, threads, 0, stream>>>(ring, last_pos, slots, tokens, positions,
                                                       valid, in_ring, batch, length, ring_stride,
                                                       w_cap, vocab_stride);
}
