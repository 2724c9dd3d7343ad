// Torch bindings of the kernels in this directory. Same argument order and semantics as
// nanospec_server/ops/reference.py; every launch goes on the current CUDA stream.
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

void launch_scatter_rows(void* dst, const int64_t* dst_rows, const void* src,
                         const int64_t* src_rows, int64_t count, int64_t row_bytes,
                         int64_t dst_stride, int64_t src_stride, int64_t dump_row,
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scatter_rows", &scatter_rows, "dst[dst_rows[i]] = src[src_rows[i]] (dump row skipped)");
}
