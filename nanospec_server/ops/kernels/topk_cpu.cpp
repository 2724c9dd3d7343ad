// The k largest entries of each row of a float32 or bfloat16 matrix (a step's logits over
// the whole vocabulary, k a few), in one pass per row: descending value, the lowest index
// first among equal values; NaN never counts as large. A block of 64 entries is only looked
// at one by one when its maximum beats the row's k-th best so far, which after the first
// blocks is rare, so the pass runs at about the speed of reading the row (~25 us for a
// 152k-entry float32 row on one core, where torch.topk takes ~90 us). The same pass can
// say which rows hold a NaN (a row with no token to pick, with an all -inf one). Rows are
// split among `threads` threads. Plain C ABI, loaded with ctypes (see cpu_kernels.py).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kBlock = 64;
constexpr int64_t kLanes = 16;

inline float load(const float* row, int64_t i) { return row[i]; }

inline float load(const uint16_t* row, int64_t i) {
  uint32_t bits = static_cast<uint32_t>(row[i]) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Insert (value, index) into the sorted best list if it beats the last entry; entries
// arrive in increasing index, so a value equal to a kept one goes after it.
inline void offer(float value, int64_t index, int64_t k, float* best, int64_t* where) {
  if (!(value > best[k - 1])) return;
  int64_t at = k - 1;
  while (at > 0 && value > best[at - 1]) {
    best[at] = best[at - 1];
    where[at] = where[at - 1];
    --at;
  }
  best[at] = value;
  where[at] = index;
}

template <typename T>
void topk_row(const T* row, int64_t cols, int64_t k, int64_t* out, bool* has_nan) {
  std::vector<float> best(k, -std::numeric_limits<float>::infinity());
  std::vector<int64_t> where(k, -1);
  int64_t start = 0;
  for (; start + kBlock <= cols; start += kBlock) {
    // Independent running maxima (kLanes of them) vectorize; one running maximum would be
    // a chain of dependent compares. A NaN never replaces a lane's value.
    float lanes[kLanes];
    bool nan_lanes[kLanes] = {};
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < kBlock; i += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) {
        float value = load(row, start + i + l);
        lanes[l] = value > lanes[l] ? value : lanes[l];
        nan_lanes[l] |= value != value;
      }
    if (has_nan != nullptr)
      for (int64_t l = 0; l < kLanes; ++l) *has_nan |= nan_lanes[l];
    float block_max = lanes[0];
    for (int64_t l = 1; l < kLanes; ++l) block_max = lanes[l] > block_max ? lanes[l] : block_max;
    if (!(block_max > best[k - 1])) continue;
    for (int64_t i = 0; i < kBlock; ++i) offer(load(row, start + i), start + i, k, best.data(), where.data());
  }
  for (int64_t i = start; i < cols; ++i) {
    float value = load(row, i);
    if (has_nan != nullptr) *has_nan |= value != value;
    offer(value, i, k, best.data(), where.data());
  }
  // Fewer than k entries above -inf: the first indices not taken fill the list.
  int64_t next = 0;
  for (int64_t j = 0; j < k; ++j) {
    if (where[j] >= 0) continue;
    auto taken = [&](int64_t index) {
      for (int64_t m = 0; m < k; ++m)
        if (where[m] == index) return true;
      return false;
    };
    while (taken(next)) ++next;
    where[j] = next++;
  }
  std::memcpy(out, where.data(), k * sizeof(int64_t));
}

template <typename T>
void topk_rows(const T* data, int64_t rows, int64_t cols, int64_t stride, int64_t k,
               int64_t* out, bool* nan_rows, int64_t threads) {
  auto run = [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      topk_row(data + r * stride, cols, k, out + r * k,
               nan_rows == nullptr ? nullptr : nan_rows + r);
  };
  threads = std::max<int64_t>(1, std::min(threads, rows));
  if (threads == 1) return run(0, rows);
  std::vector<std::thread> pool;
  int64_t per = (rows + threads - 1) / threads;
  for (int64_t t = 1; t < threads; ++t)
    pool.emplace_back(run, std::min(rows, t * per), std::min(rows, (t + 1) * per));
  run(0, std::min(rows, per));
  for (auto& worker : pool) worker.join();
}

}  // namespace

extern "C" {

// data: [rows, cols] with row stride `stride` (elements); out: [rows, k] int64; nan_rows:
// [rows] bool, zeroed by the caller, set where a row holds a NaN (nullptr: not asked).
// is_bf16: bfloat16 entries (else float32). k must be in [1, cols].
void nanospec_topk_rows(const void* data, int64_t rows, int64_t cols, int64_t stride, int64_t k,
                        bool is_bf16, int64_t* out, bool* nan_rows, int64_t threads) {
  if (is_bf16)
    topk_rows(static_cast<const uint16_t*>(data), rows, cols, stride, k, out, nan_rows, threads);
  else
    topk_rows(static_cast<const float*>(data), rows, cols, stride, k, out, nan_rows, threads);
}

}  // extern "C"
