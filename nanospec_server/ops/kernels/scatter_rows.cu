// Row gather into the packed LM-head buffer: dst[dst_rows[i]] = src[src_rows[i]].
// Entries whose dst row is `dump_row` are masked out and their block exits at once, so a
// launch over a fixed-size candidate list costs only the rows that actually enter.
// Rows are copied as raw bytes (any dtype), 16 bytes at a time when alignment allows.
#include <cstdint>
#include <cuda_runtime.h>

namespace {

template <typename Chunk>
__global__ void scatter_rows_kernel(char* dst, const int64_t* dst_rows, const char* src,
                                    const int64_t* src_rows, int64_t row_chunks,
                                    int64_t dst_stride, int64_t src_stride, int64_t dump_row) {
  const int64_t i = blockIdx.x;
  const int64_t out_row = dst_rows[i];
  if (out_row == dump_row) return;
  const Chunk* from = reinterpret_cast<const Chunk*>(src + src_rows[i] * src_stride);
  Chunk* to = reinterpret_cast<Chunk*>(dst + out_row * dst_stride);
  for (int64_t c = threadIdx.x; c < row_chunks; c += blockDim.x) to[c] = from[c];
}

}  // namespace

// Strides and row size in bytes.
void launch_scatter_rows(void* dst, const int64_t* dst_rows, const void* src,
                         const int64_t* src_rows, int64_t count, int64_t row_bytes,
                         int64_t dst_stride, int64_t src_stride, int64_t dump_row,
                         cudaStream_t stream) {
  if (count == 0) return;
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  const bool wide = row_bytes % 16 == 0 && dst_stride % 16 == 0 && src_stride % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(src) % 16 == 0;
  if (wide) {
    const int64_t chunks = row_bytes / 16;
    const int threads = chunks < 256 ? static_cast<int>((chunks + 31) / 32 * 32) : 256;
    scatter_rows_kernel<uint4><<<count, threads, 0, stream>>>(
        out, dst_rows, in, src_rows, chunks, dst_stride, src_stride, dump_row);
  } else {
    scatter_rows_kernel<char><<<count, 256, 0, stream>>>(
        out, dst_rows, in, src_rows, row_bytes, dst_stride, src_stride, dump_row);
  }
}
