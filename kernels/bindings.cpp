// Torch bindings of the kernels in this directory. Same argument order and semantics as
// nanospec_server/ops/reference.py; every launch goes on the current CUDA stream.
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

void launch_scatter_rows(void* dst, const int64_t* dst_rows, const void* src,
                         const int64_t* src_rows, int64_t count, int64_t row_bytes,
                         int64_t dst_stride, int64_t src_stride, int64_t dump_row,
                         cudaStream_t stream);

void launch_window_append(int64_t* ring, int32_t* last_pos, const int64_t* slots,
                          const int64_t* tokens, const int64_t* positions, const bool* valid,
                          const bool* in_ring, int64_t batch, int64_t length,
                          int64_t ring_stride, int64_t w_cap, int64_t vocab_stride,
                          cudaStream_t stream);

void scatter_rows(torch::Tensor dst, torch::Tensor dst_rows, torch::Tensor src,
                  torch::Tensor src_rows) {
  TORCH_CHECK(dst.is_cuda() && src.is_cuda(), "scatter_rows: CUDA tensors expected");
  TORCH_CHECK(dst.scalar_type() == src.scalar_type(), "scatter_rows: dtypes differ");
  TORCH_CHECK(dst.size(1) == src.size(1), "scatter_rows: row sizes differ");
  TORCH_CHECK(dst.stride(1) == 1 && src.stride(1) == 1, "scatter_rows: rows must be dense");
  auto out_rows = dst_rows.to(torch::kInt64).contiguous();
  auto in_rows = src_rows.to(torch::kInt64).contiguous();
  const int64_t element = dst.element_size();
  launch_scatter_rows(dst.data_ptr(), out_rows.data_ptr<int64_t>(), src.data_ptr(),
                      in_rows.data_ptr<int64_t>(), out_rows.numel(), dst.size(1) * element,
                      dst.stride(0) * element, src.stride(0) * element, dst.size(0) - 1,
                      c10::cuda::getCurrentCUDAStream().stream());
}

void window_append(torch::Tensor ring, torch::Tensor last_pos, torch::Tensor slots,
                   torch::Tensor tokens, torch::Tensor positions, torch::Tensor valid,
                   torch::Tensor in_ring) {
  TORCH_CHECK(ring.is_contiguous() && last_pos.is_contiguous(), "window_append: layout");
  TORCH_CHECK(ring.scalar_type() == torch::kInt64, "window_append: ring must be int64");
  TORCH_CHECK(last_pos.scalar_type() == torch::kInt32, "window_append: last_pos must be int32");
  auto slots_ = slots.to(torch::kInt64).contiguous();
  auto tokens_ = tokens.to(torch::kInt64).contiguous();
  auto positions_ = positions.to(torch::kInt64).contiguous();
  auto valid_ = valid.to(torch::kBool).contiguous();
  auto in_ring_ = in_ring.to(torch::kBool).contiguous();
  launch_window_append(ring.data_ptr<int64_t>(), last_pos.data_ptr<int32_t>(),
                       slots_.data_ptr<int64_t>(), tokens_.data_ptr<int64_t>(),
                       positions_.data_ptr<int64_t>(), valid_.data_ptr<bool>(),
                       in_ring_.data_ptr<bool>(), tokens_.size(0), tokens_.size(1),
                       ring.size(1), ring.size(1) - 1, last_pos.size(1),
                       c10::cuda::getCurrentCUDAStream().stream());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scatter_rows", &scatter_rows, "dst[dst_rows[i]] = src[src_rows[i]] (dump row skipped)");
  m.def("window_append", &window_append, "ring write + last_pos atomicMax per stream token");
}
