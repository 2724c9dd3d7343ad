// CPU fast path of the per-step vocabulary update: the same state transitions as the
// batched torch code in nanospec_server/vocab (window.py, union_head.py), written as plain
// sequential loops, which on a CPU beat dozens of small tensor ops. Plain C ABI, no torch
// headers: built with the system C++ compiler in a second and loaded with ctypes.
//
// Layouts (row-major; ring, latest and members rows have one trailing "dump" entry the
// torch code writes into):
//   ring [S, W_cap+1] int32, latest [S, W_cap+1] bool (the cell holds its token's latest
//   occurrence in the ring), length [S] int64, members [S, W_cap+1] int32,
//   in_set [S, ceil(V/32)] uint32 words (bit v % 32 of word v / 32: token v is a member),
//   ids [C+1] int64, row_of [V+1] int64, ref [V+1] int32, count [1] int64,
//   buf [C+1, d] and weight [V, d] of one dtype (copied as `row_bytes` raw bytes).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

struct Union {
  int64_t* ids;
  int64_t* row_of;
  int32_t* ref;
  int64_t* count;
  char* buf;
  int64_t buf_stride;
  const char* weight;
  int64_t weight_stride;
  int64_t row_bytes;
  int64_t capacity;
  int64_t overflow = 0;  // distinct new tokens that found no row (buffer full): not admitted
  // Tokens whose reference count touched 0 during this call, or that hold no row (refused
  // one earlier: they retry); settled at the end so a token that leaves one request and
  // enters another keeps its row.
  std::vector<int64_t> maybe_gone, maybe_new;

  void add_ref(int64_t token) {
    if (ref[token]++ == 0 || row_of[token] < 0) maybe_new.push_back(token);
  }
  void drop_ref(int64_t token) {
    if (--ref[token] == 0) maybe_gone.push_back(token);
  }
  void place(int64_t token, int64_t row, const char* source) {
    std::memcpy(buf + row * buf_stride, source, row_bytes);
    ids[row] = token;
    row_of[token] = row;
  }

  // Free rows of tokens no request holds, give rows to new tokens (holes first), then move
  // live rows stranded above the new count down, so rows [0, count) stay dense.
  void settle() {
    std::vector<int64_t> holes;
    for (int64_t token : maybe_gone) {
      if (ref[token] == 0 && row_of[token] >= 0) {
        holes.push_back(row_of[token]);
        ids[row_of[token]] = -1;
        row_of[token] = -1;
      }
    }
    std::sort(holes.begin(), holes.end());  // new tokens take the lowest holes
    int64_t next_row = *count;
    size_t next_hole = 0;
    constexpr int64_t kRefused = -2;  // refused this call: counted once however often listed
    for (int64_t token : maybe_new) {
      if (ref[token] > 0 && row_of[token] == -1) {
        if (next_hole == holes.size() && next_row == capacity) {
          ++overflow;  // never write past the buffer: the token stays out of the head
          row_of[token] = kRefused;
          continue;
        }
        const int64_t row = next_hole < holes.size() ? holes[next_hole++] : next_row++;
        place(token, row, weight + token * weight_stride);
      }
    }
    const int64_t new_count = next_row - static_cast<int64_t>(holes.size() - next_hole);
    int64_t source = next_row - 1;
    for (; next_hole < holes.size(); ++next_hole) {
      const int64_t hole = holes[next_hole];
      if (hole >= new_count) continue;
      while (ids[source] < 0) --source;  // a live row >= new_count exists for every hole
      place(ids[source], hole, buf + source * buf_stride);
      ids[source--] = -1;
    }
    *count = new_count;
    for (int64_t token : maybe_new) {
      if (row_of[token] == kRefused) row_of[token] = -1;
    }
    maybe_gone.clear();
    maybe_new.clear();
  }
};

// A token set over [0, V) as bits, for the membership tests of the loops below.
struct Bits {
  uint32_t* words;
  bool test(int64_t token) const { return (words[token >> 5] >> (token & 31)) & 1u; }
  void set(int64_t token) { words[token >> 5] |= 1u << (token & 31); }
  void clear(int64_t token) { words[token >> 5] &= ~(1u << (token & 31)); }
};

// Scratch of nanospec_append, reused across calls (one per thread): the tokens of one
// append marked in a V-bit set, which every call leaves all clear.
std::vector<uint32_t>& appended_marks(int64_t vocab_size) {
  thread_local std::vector<uint32_t> marks;
  marks.resize((vocab_size + 31) / 32, 0u);
  return marks;
}

}  // namespace

extern "C" {

// Append tokens[b, :] (where valid, or all if valid is null), in column order, to the
// streams of slots[b], keeping the ring's latest flags. Returns how many tokens were
// outside [0, V) (those are skipped).
int64_t nanospec_append(int64_t batch, int64_t cols, const int64_t* slots, const int64_t* tokens,
                        const bool* valid, int32_t* ring, bool* latest, int64_t* length,
                        int64_t w_cap, int64_t vocab_size) {
  int64_t invalid = 0;
  Bits marked{appended_marks(vocab_size).data()};
  thread_local std::vector<int64_t> row_tokens;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t slot = slots[b];
    const int64_t* row = tokens + b * cols;
    const bool* row_valid = valid ? valid + b * cols : nullptr;
    row_tokens.clear();
    for (int64_t i = 0; i < cols; ++i) {
      if (row_valid && !row_valid[i]) continue;
      if (row[i] < 0 || row[i] >= vocab_size) {
        ++invalid;
        continue;
      }
      row_tokens.push_back(row[i]);
    }
    const int64_t n = static_cast<int64_t>(row_tokens.size());
    // Only the last w_cap tokens of a long append can still be in the ring.
    const int64_t skip = n > w_cap ? n - w_cap : 0;
    int32_t* slot_ring = ring + slot * (w_cap + 1);
    bool* slot_latest = latest + slot * (w_cap + 1);
    const int64_t old_end = length[slot];
    const int64_t new_end = old_end + n;
    for (int64_t k = skip; k < n; ++k) marked.set(row_tokens[k]);
    // Cells that stay in the ring lose their flag when their token comes again.
    for (int64_t p = std::max<int64_t>(new_end - w_cap, 0); p < old_end; ++p) {
      const int64_t c = p % w_cap;
      if (slot_latest[c] && marked.test(slot_ring[c])) slot_latest[c] = false;
    }
    // New cells, last first: the first visit of a token is its latest occurrence, and
    // clearing its mark there leaves the scratch set clear for the next row.
    for (int64_t k = n - 1; k >= skip; --k) {
      const int64_t token = row_tokens[k];
      const int64_t c = (old_end + k) % w_cap;
      slot_ring[c] = static_cast<int32_t>(token);
      slot_latest[c] = marked.test(token);
      marked.clear(token);
    }
    length[slot] = new_end;
  }
  return invalid;
}

// Bring members/in_set of `slots` to their windows of `w_max[b]` positions (one per slot;
// or, if `release`, empty them) and apply the changes to the union head (of `capacity` rows).
// Returns how many distinct new tokens found no row in the union buffer (not admitted).
int64_t nanospec_refresh(int64_t batch, const int64_t* slots, const int64_t* w_max, int64_t w_cap,
                         int64_t vocab_size, bool release, const int32_t* ring,
                         const bool* latest, const int64_t* length, int32_t* members,
                         uint32_t* in_set, int64_t* ids, int64_t* row_of, int32_t* ref,
                         int64_t* count, char* buf, int64_t buf_stride, const char* weight,
                         int64_t weight_stride, int64_t row_bytes, int64_t capacity) {
  Union head{ids, row_of, ref, count, buf, buf_stride, weight, weight_stride, row_bytes, capacity};
  const int64_t words = (vocab_size + 31) / 32;
  thread_local std::vector<int64_t> entering;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t slot = slots[b];
    const int32_t* slot_ring = ring + slot * (w_cap + 1);
    const bool* slot_latest = latest + slot * (w_cap + 1);
    int32_t* slot_members = members + slot * (w_cap + 1);
    Bits bits{in_set + slot * words};
    if (release) {
      for (int64_t j = 0; j < w_cap; ++j) {
        if (slot_members[j] < 0) continue;
        bits.clear(slot_members[j]);
        head.drop_ref(slot_members[j]);
        slot_members[j] = -1;
      }
      continue;
    }
    const int64_t end = length[slot];
    const int64_t start = end > w_max[b] ? end - w_max[b] : 0;
    // Window tokens (each at its flagged cell) that are members: clear their bits, so the
    // bits still set afterwards are the members that left. The others enter.
    entering.clear();
    for (int64_t p = start; p < end; ++p) {
      const int64_t c = p % w_cap;
      if (!slot_latest[c]) continue;
      if (bits.test(slot_ring[c])) {
        bits.clear(slot_ring[c]);
      } else {
        entering.push_back(slot_ring[c]);
      }
    }
    for (int64_t j = 0; j < w_cap; ++j) {
      const int64_t token = slot_members[j];
      if (token < 0 || !bits.test(token)) continue;
      bits.clear(token);
      slot_members[j] = -1;
      head.drop_ref(token);
    }
    for (int64_t p = start; p < end; ++p) {
      if (slot_latest[p % w_cap]) bits.set(slot_ring[p % w_cap]);
    }
    int64_t free_entry = 0;
    for (int64_t token : entering) {
      while (slot_members[free_entry] >= 0) ++free_entry;
      slot_members[free_entry] = static_cast<int32_t>(token);
      head.add_ref(token);
    }
  }
  head.settle();
  return head.overflow;
}

}  // extern "C"
