// PyTorch's CUDA host allocator (at::HostAllocator, PyTorch 2.8 and later)
// served by pinmem pools: pin_memory(), pin_memory=True, the DataLoader's
// pinning thread and non-blocking copies to the host all get pinmem memory.
// Built by pinmem.torch.install() with torch.utils.cpp_extension.
//
// The rules are those of PyTorch's own allocator (ATen/core/
// CachingHostAllocator.h), with pinmem pools instead of power-of-two free
// lists: a request takes the pool's size class (at most 1/8 over), not the
// next power of two.
//  - A block is given back to its pool only once every stream it was used on
//    (record_event) has done the work queued before the block was freed:
//    events are recorded on those streams at free and queried before reuse.
//  - Graph capture: while a capture runs, allocations on the capturing stream
//    come from a private pool of that graph (its own pinmem pool), whose
//    memory no other allocation shares until the graph is released; a block
//    allocated during capture and used on a stream is never reused.
//  - empty_cache gives back what no block uses; statistics as PyTorch's.
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

// The part of pinmem's C API the allocator calls, by address from the
// libpinmem.so the Python package loaded: one pinmem in the process.
using pm_result = int;
struct PoolStats {  // pm_pool_stats up to live; pinmem fills as much as struct_size says
  size_t struct_size;
  unsigned long long requested, used, reserved, used_high, reserved_high, allocs, frees,
      chunks_pinned, chunks_released, pin_ns, live;
};
struct PoolProps {  // pm_mem_pool_props
  int location_type, location_id;
  unsigned handle_types;
  size_t max_size;
  unsigned char reserved[64];
};
constexpr int kLocationHost = 2;
constexpr int kAttrReservedHigh = 6, kAttrUsedHigh = 8;

struct Pinmem {
  pm_result (*alloc)(void**, size_t, void*);
  pm_result (*free)(void*);
  pm_result (*pool_create)(void**, const PoolProps*);
  pm_result (*pool_destroy)(void*);
  pm_result (*trim)(void*, size_t);
  pm_result (*stats)(void*, PoolStats*);
  pm_result (*set_attribute)(void*, int, void*);
  const char* (*result_name)(pm_result);
  const char* (*detail)();
};

const c10::MempoolId_t kDefaultPool{0, 0};

struct Block {
  void* ptr;
  size_t size;
  c10::MempoolId_t pool;
  bool during_capture;
  std::vector<c10::Stream> streams;  // where it was used (record_event)
};

struct Pending {  // a freed block and the events behind its last uses
  Block* block;
  std::vector<std::pair<c10::DeviceIndex, cudaEvent_t>> events;
};

struct PrivatePool {
  void* handle = nullptr;
  int use_count = 1;
  size_t blocks = 0;  // held: in use, pending or never reusable
};

bool stream_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(s, &status) == cudaSuccess &&
         status != cudaStreamCaptureStatusNone;
}

void deleter(void* ctx);

// The allocator PyTorch had before install(): graphs captured before it
// was installed hold pools of that allocator's, released into this one.
at::HostAllocator* previous = nullptr;

class PinmemHostAllocator final : public at::HostAllocator {
 public:
  PinmemHostAllocator(const Pinmem& pm, void* pool) : pm_(pm), pool_(pool) {}

  at::DataPtr allocate(size_t n) override {
    const at::Device cpu(at::DeviceType::CPU);
    if (n == 0)
      return {nullptr, nullptr, &deleter, cpu};
    c10::MempoolId_t id = kDefaultPool;
    bool during_capture = false;
    void* pool;
    {
      std::lock_guard<std::mutex> g(mutex_);
      if (!captures_.empty()) {
        auto current = c10::cuda::getCurrentCUDAStream();
        for (auto& c : captures_)
          if (c.second(current.unwrap())) {
            id = c.first;
            break;
          }
        during_capture = stream_capturing(current.stream());
      }
      process_events_locked(&id);
      pool = pool_locked(id);
    }
    void* p = nullptr;
    pm_result r = pm_.alloc(&p, n, pool);
    TORCH_CHECK(r == 0, "pinmem: pinned memory of ", n, " bytes could not be allocated (",
                pm_.result_name(r), ": ", pm_.detail(), ")");
    auto* b = new Block{p, n, id, during_capture, {}};
    std::lock_guard<std::mutex> g(mutex_);
    live_.emplace(p, b);
    live_blocks_.insert(b);
    if (id != kDefaultPool)
      private_[id].blocks++;
    active_requests_.increase(1);
    active_bytes_.increase(n);
    allocations_.increase(1);
    allocated_bytes_.increase(n);
    return {p, b, &deleter, cpu};
  }

  void free(Block* b) {
    std::vector<c10::Stream> streams;
    {
      std::lock_guard<std::mutex> g(mutex_);
      live_.erase(b->ptr);
      live_blocks_.erase(b);
      streams.swap(b->streams);
      active_requests_.decrease(1);
      active_bytes_.decrease(b->size);
      // Recorded events say nothing while a capture only records work: a
      // block allocated then and used on a stream is never reused.
      if (!streams.empty() && b->during_capture)
        return;
    }
    if (streams.empty())
      return give_back(b);
    Pending pending{b, {}};
    for (const auto& s : streams) {
      cudaEvent_t e = record(s);
      if (!e) {  // no event, no knowing when the stream is done: never reused
        for (auto& ev : pending.events)
          recycle(ev.first, ev.second);
        return;
      }
      pending.events.emplace_back(s.device_index(), e);
    }
    std::lock_guard<std::mutex> g(mutex_);
    pending_.push_back(std::move(pending));
  }

  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    std::lock_guard<std::mutex> g(mutex_);
    Block* b = live_blocks_.count(static_cast<Block*>(ctx)) ? static_cast<Block*>(ctx) : nullptr;
    if (!b) {
      auto it = live_.find(ptr);
      if (it == live_.end())
        return false;  // not this allocator's memory
      b = it->second;
    }
    auto& streams = b->streams;
    if (std::find(streams.begin(), streams.end(), stream) == streams.end())
      streams.push_back(stream);
    return true;
  }

  void empty_cache() override {
    std::vector<void*> gone;
    {
      std::lock_guard<std::mutex> g(mutex_);
      process_events_locked(nullptr);
      for (auto it = private_.begin(); it != private_.end();)
        if (it->second.use_count == 0 && it->second.blocks == 0) {
          if (it->second.handle)
            gone.push_back(it->second.handle);
          it = private_.erase(it);
        } else {
          ++it;
        }
    }
    for (void* p : gone)
      pm_.pool_destroy(p);
    pm_.trim(pool_, 0);
    std::lock_guard<std::mutex> g(mutex_);
    for (auto& ev : spare_events_) {
      c10::cuda::CUDAGuard guard(ev.first);
      for (cudaEvent_t e : ev.second)
        cudaEventDestroy(e);
    }
    spare_events_.clear();
  }

  at::HostStats get_stats() override {
    at::HostStats s;
    unsigned long long reserved = 0, pin_ns = 0, pinned = 0, released = 0;
    for (void* pool : pools()) {
      PoolStats ps{};
      ps.struct_size = sizeof ps;
      if (pm_.stats(pool, &ps) == 0) {
        reserved += ps.reserved;
        pin_ns += ps.pin_ns;
        pinned += ps.chunks_pinned;
        released += ps.chunks_released;
      }
    }
    std::lock_guard<std::mutex> g(mutex_);
    s.active_requests = active_requests_;
    s.active_bytes = active_bytes_;
    s.allocations = allocations_;
    // Bytes pinned for the allocator: its pools' reserved memory, used or not.
    reserved_peak_ = std::max<int64_t>(reserved_peak_, static_cast<int64_t>(reserved));
    s.allocated_bytes = allocated_bytes_;
    s.allocated_bytes.current = static_cast<int64_t>(reserved);
    s.allocated_bytes.peak = reserved_peak_;
    s.host_alloc_time.total = static_cast<int64_t>(pin_ns / 1000);
    s.host_alloc_time.count = static_cast<int64_t>(pinned);
    s.num_host_alloc = static_cast<int64_t>(pinned);
    s.num_host_free = static_cast<int64_t>(released);
    return s;
  }

  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> g(mutex_);
    for (auto* st : {&active_requests_, &active_bytes_, &allocations_, &allocated_bytes_})
      st->reset_accumulated();
  }

  void reset_peak_stats() override {
    for (void* pool : pools()) {
      uint64_t zero = 0;
      pm_.set_attribute(pool, kAttrReservedHigh, &zero);
      pm_.set_attribute(pool, kAttrUsedHigh, &zero);
    }
    std::lock_guard<std::mutex> g(mutex_);
    for (auto* st : {&active_requests_, &active_bytes_, &allocations_, &allocated_bytes_})
      st->reset_peak();
    reserved_peak_ = 0;
  }

  void begin_allocate_to_pool(c10::MempoolId_t id,
                              std::function<bool(c10::Stream)> filter) override {
    std::lock_guard<std::mutex> g(mutex_);
    for (auto& c : captures_)
      TORCH_CHECK(c.first != id, "pinmem: already allocating to this graph's pool");
    auto it = private_.find(id);
    if (it == private_.end())
      private_.emplace(id, PrivatePool{});
    else
      it->second.use_count++;
    captures_.emplace_back(id, std::move(filter));
  }

  void end_allocate_to_pool(c10::MempoolId_t id) override {
    {
      std::lock_guard<std::mutex> g(mutex_);
      auto it = std::find_if(captures_.begin(), captures_.end(),
                             [&](const auto& c) { return c.first == id; });
      if (it != captures_.end()) {
        captures_.erase(it);
        return;
      }
    }
    // A capture begun before install(): the allocator it began in ends it.
    TORCH_CHECK(previous, "pinmem: not allocating to this graph's pool");
    previous->end_allocate_to_pool(id);
  }

  // Whether a CUDA graph still holds one of this allocator's private pools:
  // PyTorch releases a graph's pool into whichever allocator is current when
  // the graph dies, and its own does not know pools made here.
  bool graph_pools_in_use() {
    std::lock_guard<std::mutex> g(mutex_);
    if (!captures_.empty())
      return true;
    for (const auto& p : private_)
      if (p.second.use_count > 0)
        return true;
    return false;
  }

  // Called as a graph dies, from its destructor: a pool this allocator does
  // not know (a graph captured before install()) goes to the allocator that
  // made it, as throwing here would end the process.
  void release_pool(c10::MempoolId_t id) override {
    {
      std::lock_guard<std::mutex> g(mutex_);
      auto it = private_.find(id);
      if (it != private_.end()) {
        if (it->second.use_count > 0)
          it->second.use_count--;
        return;
      }
    }
    if (previous)
      previous->release_pool(id);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // For pinmem.torch's tests: blocks in use, waiting for their streams, and
  // held by graphs' pools.
  std::unordered_map<std::string, int64_t> counts() {
    std::lock_guard<std::mutex> g(mutex_);
    int64_t in_graph_pools = 0;
    for (auto& p : private_)
      in_graph_pools += static_cast<int64_t>(p.second.blocks);
    return {{"live", static_cast<int64_t>(live_.size())},
            {"pending", static_cast<int64_t>(pending_.size())},
            {"graph_pool_blocks", in_graph_pools},
            {"graph_pools", static_cast<int64_t>(private_.size())}};
  }

 private:
  // The pinmem pool of a graph's private pool, made on first use.
  void* pool_locked(const c10::MempoolId_t& id) {
    if (id == kDefaultPool)
      return pool_;
    auto& p = private_[id];
    if (!p.handle) {
      PoolProps props{};
      props.location_type = kLocationHost;
      pm_result r = pm_.pool_create(&p.handle, &props);
      TORCH_CHECK(r == 0, "pinmem: a pool for a CUDA graph could not be made (",
                  pm_.result_name(r), ": ", pm_.detail(), ")");
    }
    return p.handle;
  }

  std::vector<void*> pools() {
    std::lock_guard<std::mutex> g(mutex_);
    std::vector<void*> all{pool_};
    for (auto& p : private_)
      if (p.second.handle)
        all.push_back(p.second.handle);
    return all;
  }

  cudaEvent_t record(const c10::Stream& s) {
    c10::cuda::CUDAGuard guard(s.device_index());
    cudaEvent_t e = nullptr;
    {
      std::lock_guard<std::mutex> g(mutex_);
      auto& spare = spare_events_[s.device_index()];
      if (!spare.empty()) {
        e = spare.back();
        spare.pop_back();
      }
    }
    if (!e && cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess)
      return nullptr;
    if (cudaEventRecord(e, c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, s).stream()) !=
        cudaSuccess) {
      recycle(s.device_index(), e);
      return nullptr;
    }
    return e;
  }

  void recycle(c10::DeviceIndex device, cudaEvent_t e) {
    std::lock_guard<std::mutex> g(mutex_);
    spare_events_[device].push_back(e);
  }

  // Gives back the pending blocks (of one pool, or all) whose streams are
  // done. An event that fails its query keeps its block forever.
  void process_events_locked(const c10::MempoolId_t* only) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (only && it->block->pool != *only) {
        ++it;
        continue;
      }
      bool done = std::all_of(it->events.begin(), it->events.end(), [](const auto& ev) {
        return cudaEventQuery(ev.second) == cudaSuccess;
      });
      if (!done) {
        ++it;
        continue;
      }
      for (auto& ev : it->events)
        spare_events_[ev.first].push_back(ev.second);
      Block* b = it->block;
      it = pending_.erase(it);
      release_locked(b);
      pm_.free(b->ptr);
      delete b;
    }
  }

  void release_locked(Block* b) {
    allocations_.decrease(1);
    allocated_bytes_.decrease(b->size);
    if (b->pool != kDefaultPool)
      private_[b->pool].blocks--;
  }

  void give_back(Block* b) {
    {
      std::lock_guard<std::mutex> g(mutex_);
      release_locked(b);
    }
    pm_.free(b->ptr);
    delete b;
  }

  const Pinmem pm_;
  void* const pool_;
  std::mutex mutex_;  // everything below
  std::unordered_map<void*, Block*> live_;  // blocks in use, by pointer and by context
  std::unordered_set<Block*> live_blocks_;
  std::deque<Pending> pending_;
  std::unordered_map<c10::DeviceIndex, std::vector<cudaEvent_t>> spare_events_;
  std::unordered_map<c10::MempoolId_t, PrivatePool, c10::MempoolIdHash> private_;
  std::vector<std::pair<c10::MempoolId_t, std::function<bool(c10::Stream)>>> captures_;
  c10::CachingAllocator::Stat active_requests_, active_bytes_, allocations_, allocated_bytes_;
  int64_t reserved_peak_ = 0;
};

PinmemHostAllocator* instance = nullptr;  // never destroyed: blocks may outlive install
constexpr uint8_t kPriority = 100;  // above the allocator PyTorch registers at start

void deleter(void* ctx) {
  if (ctx)
    instance->free(static_cast<Block*>(ctx));
}

template <typename F>
F function(const std::unordered_map<std::string, uintptr_t>& fns, const char* name) {
  auto it = fns.find(name);
  TORCH_CHECK(it != fns.end() && it->second, "pinmem: ", name, " was not given");
  return reinterpret_cast<F>(it->second);
}

void install(uintptr_t pool, const std::unordered_map<std::string, uintptr_t>& fns) {
  if (!instance) {
    Pinmem pm{
        function<decltype(Pinmem::alloc)>(fns, "pm_mem_alloc_from_pool"),
        function<decltype(Pinmem::free)>(fns, "pm_mem_free"),
        function<decltype(Pinmem::pool_create)>(fns, "pm_mem_pool_create"),
        function<decltype(Pinmem::pool_destroy)>(fns, "pm_mem_pool_destroy"),
        function<decltype(Pinmem::trim)>(fns, "pm_mem_pool_trim_to"),
        function<decltype(Pinmem::stats)>(fns, "pm_mem_pool_get_stats"),
        function<decltype(Pinmem::set_attribute)>(fns, "pm_mem_pool_set_attribute"),
        function<decltype(Pinmem::result_name)>(fns, "pm_result_name"),
        function<decltype(Pinmem::detail)>(fns, "pm_last_error_detail"),
    };
    instance = new PinmemHostAllocator(pm, reinterpret_cast<void*>(pool));
  }
  at::HostAllocator* current = at::getHostAllocator(at::kCUDA);
  if (current == instance)
    return;
  previous = current;
  at::setHostAllocator(at::kCUDA, instance, kPriority);
  TORCH_CHECK(at::getHostAllocator(at::kCUDA) == instance,
              "pinmem: PyTorch kept its own CUDA host allocator (one of a higher priority is set)");
}

void uninstall() {
  if (!instance || !previous || at::getHostAllocator(at::kCUDA) != instance)
    return;
  TORCH_CHECK(!instance->graph_pools_in_use(),
              "pinmem: cannot uninstall while a CUDA graph captured with pinmem's allocator "
              "(or a capture) is alive: PyTorch would release its pool into its own allocator, "
              "which does not know it; delete the graph first");
  at::setHostAllocator(at::kCUDA, previous, kPriority);
}

bool installed() {
  return instance && at::getHostAllocator(at::kCUDA) == instance;
}

std::unordered_map<std::string, int64_t> counts() {
  return instance ? instance->counts() : std::unordered_map<std::string, int64_t>{};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install, "Serves PyTorch's CUDA host allocator from the pinmem pool");
  m.def("uninstall", &uninstall, "Puts the allocator PyTorch had before back");
  m.def("installed", &installed, "Whether PyTorch's CUDA host allocator is pinmem's");
  m.def("counts", &counts, "Blocks in use, pending on streams, and in graph pools");
}
