// The "npu" device (PyTorch's PrivateUse1) on a CPU host: tensors of device npu:N whose memory is host
// memory. Built and loaded by verl_patches/npu_emulation/device/build.py, on a CPU host only.
//
// What it registers, and why each piece is needed on torch 2.5.1 (no Python-level registration exists):
//  * an allocator (64-byte aligned host memory, counted per device) so factories can make npu storages;
//  * a device guard (device count from ASCEND_RT_VISIBLE_DEVICES, a current device per thread, one stream
//    per device, events that record nothing) so DeviceGuard, autograd's device threads and npu:N work;
//  * PrivateUse1 hooks (generator, pinned allocator, storage resize) that torch asks a registered backend;
//  * a generator class for torch.Generator(device="npu");
//  * explicit kernels for what must not be emulated by running on CPU: factories, views of the storage,
//    resize_, set_, copies between devices, .item();
//  * a boxed fallback for every other op: npu arguments become CPU tensors over the same memory, the CPU
//    kernel runs, results map back (inputs written in place stay the caller's tensors, views stay views of
//    the npu storage, new results are copied into npu memory);
//  * c10d kernels for npu tensors that run the CPU (gloo) kernel on the same memory.
#include <torch/extension.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 64;
constexpr size_t kAlign = 64;
// A block starts with this header (so the deleter knows size and device); the data follows, still aligned.
constexpr size_t kHeader = 64;

// ---- devices -------------------------------------------------------------------------------------------

// The same count as torch.npu.device_count() (site/torch_npu/npu/__init__.py), never below one.
c10::DeviceIndex visible_device_count() noexcept {
  const char* raw = std::getenv("ASCEND_RT_VISIBLE_DEVICES");
  if (raw == nullptr) {
    return 1;
  }
  int count = 0;
  bool item = false;
  for (const char* p = raw;; ++p) {
    if (*p == ',' || *p == '\0') {
      count += item ? 1 : 0;
      item = false;
      if (*p == '\0') {
        break;
      }
    } else if (*p != ' ' && *p != '\t') {
      item = true;
    }
  }
  if (count < 1) {
    return 1;
  }
  return static_cast<c10::DeviceIndex>(count < kMaxDevices ? count : kMaxDevices);
}

// As on CUDA/NPU the current device is per thread (autograd's device threads set theirs); a thread that
// never chose one follows the process default, which torch.npu.set_device sets.
std::atomic<int> g_default_device{0};
thread_local int t_device = -1;

c10::DeviceIndex current_index() noexcept {
  return static_cast<c10::DeviceIndex>(t_device >= 0 ? t_device : g_default_device.load());
}

void check_index(c10::DeviceIndex index) {
  const auto count = visible_device_count();
  TORCH_CHECK(index >= 0 && index < count, "Invalid device ID ", static_cast<int>(index), ": this process sees ",
              static_cast<int>(count), " NPU(s) (ASCEND_RT_VISIBLE_DEVICES)");
}

// ---- allocator and its counters ------------------------------------------------------------------------

std::array<std::atomic<int64_t>, kMaxDevices> g_allocated{};
std::array<std::atomic<int64_t>, kMaxDevices> g_peak{};

struct BlockHeader {
  size_t nbytes;
  c10::DeviceIndex device;
};

void count_alloc(c10::DeviceIndex device, size_t nbytes) {
  const int64_t now = g_allocated[device].fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  int64_t peak = g_peak[device].load();
  while (now > peak && !g_peak[device].compare_exchange_weak(peak, now)) {
  }
}

void free_block(void* data) {
  if (data == nullptr) {
    return;
  }
  auto* header = reinterpret_cast<BlockHeader*>(static_cast<char*>(data) - kHeader);
  g_allocated[header->device].fetch_sub(static_cast<int64_t>(header->nbytes));
  std::free(header);
}

c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes) {
  const c10::Device where(kNpu, device);
  if (nbytes == 0) {
    return {nullptr, nullptr, &free_block, where};
  }
  const size_t rounded = (nbytes + kAlign - 1) / kAlign * kAlign;
  void* base = nullptr;
  TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&base, kAlign, kHeader + rounded) == 0,
                   "npu emulation: cannot allocate ", nbytes, " bytes of host memory for npu:", static_cast<int>(device));
  auto* header = static_cast<BlockHeader*>(base);
  header->nbytes = nbytes;
  header->device = device;
  void* data = static_cast<char*>(base) + kHeader;
  count_alloc(device, nbytes);
  return {data, data, &free_block, where};
}

struct NpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_on(current_index(), nbytes);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_block;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

NpuAllocator g_allocator;
REGISTER_ALLOCATOR(kNpu, &g_allocator);

// Grow or shrink an npu storage in place (same StorageImpl, new memory), keeping its leading bytes.
void resize_npu_storage(c10::StorageImpl* storage, size_t nbytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  c10::DataPtr fresh = allocate_on(storage->device().index() >= 0 ? storage->device().index() : current_index(), nbytes);
  const size_t keep = std::min(nbytes, storage->nbytes());
  if (keep > 0) {
    std::memcpy(fresh.get(), storage->data(), keep);
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}

void ensure_storage_bytes(const at::Tensor& t, size_t needed) {
  c10::StorageImpl* storage = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) {
    resize_npu_storage(storage, needed);
  }
}

// ---- device guard --------------------------------------------------------------------------------------

// "npu" without an index names the current device, as a stream or a tensor made there would
c10::Device with_index(c10::Device d) {
  return d.has_index() ? d : c10::Device(kNpu, current_index());
}

struct NpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kNpu;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    if (d.index() != old.index()) {
      setDevice(d);
    }
    return old;
  }
  c10::Device getDevice() const override {
    return {kNpu, current_index()};
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kNpu, "npu device guard given device ", d);
    check_index(d.index());
    t_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    t_device = d.index();
  }
  // One stream per device: the host runs every "kernel" in order.
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, with_index(d));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, with_index(d));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*isHighPriority*/) const override {
    return c10::Stream(c10::Stream::DEFAULT, with_index(d));
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return c10::Stream(c10::Stream::DEFAULT, with_index(d));
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, with_index(s.device()));
  }
  // Events record nothing: with one in-order stream every recorded point has already passed.
  void destroyEvent(void* /*event*/, const c10::DeviceIndex /*device_index*/) const noexcept override {}
  void record(void** /*event*/, const c10::Stream& /*stream*/, const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag /*flag*/) const override {}
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override {
    return true;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return visible_device_count();
  }
  bool queryStream(const c10::Stream& /*stream*/) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  void synchronizeEvent(void* /*event*/) const override {}
  double elapsedTime(void* /*event1*/, void* /*event2*/, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(false, "npu emulation: events record no time on a CPU host, elapsed_time has nothing to measure");
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuardImpl);

// ---- generator -----------------------------------------------------------------------------------------

// torch.Generator(device="npu"): the CPU generator's algorithm and state, named npu:N. Ops run on the CPU,
// so a call that passes one gets a CPU copy of its state and the state is written back afterwards.
struct NpuGeneratorImpl final : at::CPUGeneratorImpl {
  explicit NpuGeneratorImpl(c10::DeviceIndex index) {
    device_ = c10::Device(kNpu, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

at::Generator make_npu_generator(c10::DeviceIndex index) {
  return at::make_generator<NpuGeneratorImpl>(index < 0 ? current_index() : index);
}

REGISTER_GENERATOR_PRIVATEUSE1(make_npu_generator)

// ---- hooks ---------------------------------------------------------------------------------------------

struct NpuHooks final : at::PrivateUse1HooksInterface {
  // The npu RNG is the host's: torch.npu.manual_seed / get_rng_state act on torch.default_generator (as
  // transfer_to_npu needs), and random ops on npu tensors draw from it, so torch.manual_seed reproduces them.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex /*device_index*/) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return {kNpu, current_index()};
  }
  bool isPinnedPtr(const void* /*data*/) const override {
    return false;
  }
  // Pinned host memory only matters for DMA to a device; here the device is the host.
  at::Allocator* getPinnedMemoryAllocator() const override {
    return c10::GetCPUAllocator();
  }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override {
    return true;
  }
  void initPrivateUse1() const override {}
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_npu_storage(storage.unsafeGetStorageImpl(), newsize);
  }
  c10::DeviceIndex deviceCount() const override {
    return visible_device_count();
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_index(device);
    t_device = device;
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_index();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const auto old = current_index();
    setCurrentDevice(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
};

// ---- CPU aliases of npu memory -------------------------------------------------------------------------

bool is_npu(const at::Tensor& t) {
  return t.defined() && t.device().type() == kNpu;
}

// A CPU storage over the memory of `storage`; it holds a reference to it, so an asynchronous collective
// that keeps the alias keeps the memory too. Resizable: a CPU kernel may resize an out= argument, which
// then moves to new CPU memory (sync_back copies it into the npu storage).
c10::Storage cpu_storage_over(const c10::Storage& storage) {
  c10::Storage keep = storage;
  void* data = const_cast<void*>(storage.data());
  c10::DataPtr ptr = c10::InefficientStdFunctionContext::makeDataPtr(
      data, [keep](void*) mutable { keep = c10::Storage(); }, c10::Device(c10::kCPU));
  return c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(ptr), c10::GetCPUAllocator(),
                      /*resizable=*/true);
}

at::Tensor tensor_over(c10::Storage storage, const at::Tensor& like, c10::DispatchKey key) {
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  out._set_conj(like.is_conj());
  out._set_neg(like.is_neg());
  return out;
}

// A CPU alias is a plain tensor even when made under inference mode: it stands for device memory, which a
// device kernel (HCCL writing a collective's output, on its own thread) writes without autograd's checks;
// gloo's worker threads run outside the caller's inference mode and would refuse to write an inference tensor.
at::Tensor plain_cpu_tensor_over(c10::Storage storage, const at::Tensor& like) {
  c10::InferenceMode not_inference(false);
  return tensor_over(std::move(storage), like, c10::DispatchKey::CPU);
}

at::Tensor cpu_alias(const at::Tensor& t) {
  TORCH_CHECK(is_npu(t), "cpu_alias expects an npu tensor, got one on ", t.device());
  return plain_cpu_tensor_over(cpu_storage_over(t.storage()), t);
}

at::Tensor npu_alias(const at::Tensor& t) {
  TORCH_CHECK(t.defined() && t.is_cpu() && t.layout() == at::kStrided, "npu_alias expects a strided CPU tensor");
  c10::Storage keep = t.storage();
  c10::DataPtr ptr = c10::InefficientStdFunctionContext::makeDataPtr(
      const_cast<void*>(keep.data()), [keep](void*) mutable { keep = c10::Storage(); }, c10::Device(kNpu, current_index()));
  c10::Storage storage(c10::Storage::use_byte_size_t(), keep.nbytes(), std::move(ptr), nullptr, /*resizable=*/false);
  return tensor_over(std::move(storage), t, c10::DispatchKey::PrivateUse1);
}

// A new npu tensor with the same sizes, strides and values as a CPU result (the span from its first
// element is copied, so any layout, overlapping ones included, is kept).
at::Tensor npu_copy_of(const at::Tensor& r, c10::DeviceIndex device) {
  TORCH_CHECK(r.layout() == at::kStrided, "npu emulation: cannot move a ", r.layout(), " result to npu");
  const size_t nbytes = at::detail::computeStorageNbytes(r.sizes(), r.strides(), r.itemsize(), 0);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, allocate_on(device, nbytes), &g_allocator, true);
  if (nbytes > 0) {
    std::memcpy(storage.mutable_data(), r.const_data_ptr(), nbytes);
  }
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), r.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(r.sizes(), r.strides(), 0);
  out._set_conj(r.is_conj());
  out._set_neg(r.is_neg());
  return out;
}

// Every npu tensor of one call, aliased on the CPU: one CPU storage per npu storage (so the CPU kernel's
// overlap checks see arguments that share memory), and how to map results back.
struct CallAliases {
  struct StorageEntry {
    c10::Storage npu;
    c10::Storage cpu;
    const void* data_at_call;
    c10::DispatchKeySet keys;  // of the first npu tensor seen on it: what a view of it gets, as on a device
  };
  struct TensorEntry {
    at::Tensor npu;
    at::Tensor cpu;
    size_t storage;
  };
  std::vector<StorageEntry> storages;
  std::vector<TensorEntry> tensors;
  std::unordered_map<const c10::StorageImpl*, size_t> by_npu_storage;
  std::unordered_map<const c10::StorageImpl*, size_t> by_cpu_storage;
  std::unordered_map<const c10::TensorImpl*, size_t> by_cpu_tensor;
  std::vector<std::pair<at::Generator, at::Generator>> generators;  // (npu generator, its CPU copy)
  c10::DeviceIndex device = -1;

  at::Tensor alias(const at::Tensor& t) {
    if (device < 0) {
      device = t.device().index();
    }
    const c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    auto found = by_npu_storage.find(key);
    size_t index;
    if (found == by_npu_storage.end()) {
      index = storages.size();
      storages.push_back({t.storage(), cpu_storage_over(t.storage()), t.storage().data(), t.key_set()});
      by_npu_storage.emplace(key, index);
      by_cpu_storage.emplace(storages.back().cpu.unsafeGetStorageImpl(), index);
    } else {
      index = found->second;
    }
    at::Tensor cpu = plain_cpu_tensor_over(storages[index].cpu, t);
    by_cpu_tensor.emplace(cpu.unsafeGetTensorImpl(), tensors.size());
    tensors.push_back({t, cpu, index});
    return cpu;
  }

  at::Generator cpu_generator(const at::Generator& g) {
    auto* npu = dynamic_cast<at::CPUGeneratorImpl*>(g.unsafeGetGeneratorImpl());
    TORCH_CHECK(npu != nullptr, "npu emulation: generator on ", g.device(), " is not this emulation's");
    at::Generator cpu = at::make_generator<at::CPUGeneratorImpl>();
    auto* c = cpu.get<at::CPUGeneratorImpl>();
    c->set_engine(npu->engine());
    c->set_next_float_normal_sample(npu->next_float_normal_sample());
    c->set_next_double_normal_sample(npu->next_double_normal_sample());
    generators.emplace_back(g, cpu);
    return cpu;
  }

  // What the CPU kernel did to the aliases, made true of the npu tensors: a storage it reallocated (resize
  // of an out= argument) grows the npu storage and takes the new bytes; sizes/strides it changed follow.
  void sync_back() {
    for (auto& s : storages) {
      if (s.cpu.data() != s.data_at_call) {
        c10::StorageImpl* npu = s.npu.unsafeGetStorageImpl();
        if (npu->nbytes() < s.cpu.nbytes()) {
          resize_npu_storage(npu, s.cpu.nbytes());
        }
        if (s.cpu.nbytes() > 0) {
          std::memcpy(npu->mutable_data(), s.cpu.data(), s.cpu.nbytes());
        }
      }
    }
    for (auto& e : tensors) {
      c10::TensorImpl* cpu = e.cpu.unsafeGetTensorImpl();
      c10::TensorImpl* npu = e.npu.unsafeGetTensorImpl();
      if (cpu->unsafe_storage().unsafeGetStorageImpl() != storages[e.storage].cpu.unsafeGetStorageImpl()) {
        // the kernel gave the argument other memory (set_ inside a CPU kernel): copy it over
        at::Tensor moved = npu_copy_of(e.cpu, e.npu.device().index());
        npu->set_storage_keep_dtype(moved.storage());
        npu->set_sizes_and_strides(e.cpu.sizes(), e.cpu.strides(), 0);
        continue;
      }
      if (cpu->sizes() != npu->sizes() || cpu->strides() != npu->strides() ||
          cpu->storage_offset() != npu->storage_offset()) {
        npu->set_sizes_and_strides(cpu->sizes(), cpu->strides(), cpu->storage_offset());
      }
    }
    for (auto& [npu_gen, cpu_gen] : generators) {
      auto* n = dynamic_cast<at::CPUGeneratorImpl*>(npu_gen.unsafeGetGeneratorImpl());
      auto* c = cpu_gen.get<at::CPUGeneratorImpl>();
      n->set_engine(c->engine());
      n->set_next_float_normal_sample(c->next_float_normal_sample());
      n->set_next_double_normal_sample(c->next_double_normal_sample());
    }
  }

  // A CPU result back on npu: an argument itself, a view into an argument's memory, or a new tensor.
  at::Tensor to_npu(const at::Tensor& r, const std::string& op) {
    if (!r.defined() || !r.is_cpu()) {
      return r;
    }
    auto same = by_cpu_tensor.find(r.unsafeGetTensorImpl());
    if (same != by_cpu_tensor.end()) {
      return tensors[same->second].npu;
    }
    const size_t index = storage_of(r);
    if (index == storages.size()) {
      return npu_copy_of(r, device < 0 ? current_index() : device);
    }
    // a view: same memory, on the npu storage
    int64_t offset = r.storage_offset();
    if (r.storage().unsafeGetStorageImpl() != storages[index].cpu.unsafeGetStorageImpl()) {
      // another CPU storage over our memory: its offset counts from its own start, so count in bytes
      const auto* base = static_cast<const char*>(storages[index].cpu.data());
      const auto bytes = static_cast<const char*>(r.const_data_ptr()) - base;
      TORCH_CHECK(bytes % static_cast<std::ptrdiff_t>(r.itemsize()) == 0, "npu emulation: ", op,
                  " returned a view of an npu input at a byte offset that is not a multiple of its element size; "
                  "no npu tensor can describe it");
      offset = bytes / static_cast<std::ptrdiff_t>(r.itemsize());
    }
    at::Tensor v = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(storages[index].npu),
                                                            storages[index].keys, r.dtype());
    v.unsafeGetTensorImpl()->set_sizes_and_strides(r.sizes(), r.strides(), offset);
    v._set_conj(r.is_conj());
    v._set_neg(r.is_neg());
    return v;
  }

  // Which aliased storage a CPU result lives in (storages.size() when none): its own StorageImpl is one
  // of ours, or its first element lies inside one of ours.
  size_t storage_of(const at::Tensor& r) const {
    if (!r.has_storage()) {
      return storages.size();
    }
    auto found = by_cpu_storage.find(r.storage().unsafeGetStorageImpl());
    if (found != by_cpu_storage.end()) {
      return found->second;
    }
    if (r.numel() == 0) {
      return storages.size();
    }
    const auto* p = static_cast<const char*>(r.const_data_ptr());
    for (size_t i = 0; i < storages.size(); ++i) {
      const auto* b = static_cast<const char*>(storages[i].cpu.data());
      if (b != nullptr && p >= b && p < b + storages[i].cpu.nbytes()) {
        return i;
      }
    }
    return storages.size();
  }
};

// ---- the boxed fallback --------------------------------------------------------------------------------

// aten ops whose CUDA kernels take index tensors from the CPU (they move them to the device themselves).
bool takes_cpu_indices(const c10::OperatorName& name, const std::string& arg) {
  if (arg != "indices") {
    return false;
  }
  static const std::array<const char*, 4> ops = {"aten::index", "aten::_index_put_impl_", "aten::_index_put_impl",
                                                 "aten::index_put_"};
  for (const char* op : ops) {
    if (name.name == op) {
      return true;
    }
  }
  return false;
}

std::string op_name(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// A real device refuses a non-scalar CPU tensor (or a tensor of another npu) mixed with its own tensors.
void check_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const auto& schema = op.schema();
  std::optional<c10::Device> npu;
  std::string cpu_arg;
  std::function<void(const std::string&, const c10::IValue&)> visit = [&](const std::string& arg, const c10::IValue& v) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (is_npu(t)) {
        TORCH_CHECK(!npu.has_value() || *npu == t.device(),
                    "Expected all tensors to be on the same device, but found at least two devices, ", *npu, " and ",
                    t.device(), "! (argument '", arg, "' of op ", op_name(op), ")");
        npu = t.device();
      } else if (t.defined() && t.is_cpu() && t.dim() > 0 && cpu_arg.empty() &&
                 !takes_cpu_indices(op.operator_name(), arg)) {
        cpu_arg = arg;
      }
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) {
        visit(arg, e);
      }
    }
  };
  for (size_t i = first; i < stack.size(); ++i) {
    visit(schema.arguments()[i - first].name(), stack[i]);
  }
  TORCH_CHECK(!npu.has_value() || cpu_arg.empty(),
              "Expected all tensors to be on the same device, but found at least two devices, ", *npu,
              " and cpu! (argument '", cpu_arg, "' of op ", op_name(op), ")");
}

c10::IValue args_to_cpu(const c10::IValue& v, CallAliases& call) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return is_npu(t) ? c10::IValue(call.alias(t)) : v;
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorVector()) {
      out.push_back(is_npu(t) ? call.alias(t) : t);
    }
    return out;
  }
  if (v.isList()) {
    auto in = v.toList();
    c10::impl::GenericList out(in.elementType());
    out.reserve(in.size());
    for (const c10::IValue& e : v.toListRef()) {
      out.push_back(args_to_cpu(e, call));
    }
    return out;
  }
  if (v.isGenerator()) {
    const at::Generator& g = v.toGenerator();
    return g.defined() && g.device().type() == kNpu ? c10::IValue(call.cpu_generator(g)) : v;
  }
  if (v.isDevice() && v.toDevice().type() == kNpu) {
    if (call.device < 0) {
      call.device = v.toDevice().has_index() ? v.toDevice().index() : current_index();
    }
    return c10::Device(c10::kCPU);
  }
  return v;
}

c10::IValue results_to_npu(const c10::IValue& v, CallAliases& call, const std::string& op) {
  if (v.isTensor()) {
    return call.to_npu(v.toTensor(), op);
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorVector()) {
      out.push_back(call.to_npu(t, op));
    }
    return out;
  }
  if (v.isList()) {
    auto in = v.toList();
    c10::impl::GenericList out(in.elementType());
    out.reserve(in.size());
    for (const c10::IValue& e : v.toListRef()) {
      out.push_back(results_to_npu(e, call, op));
    }
    return out;
  }
  return v;
}


// Run `op` on the CPU over the same memory, then map its results back to npu.
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool check_aten_devices) {
  const auto& schema = op.schema();
  const size_t first = stack->size() - schema.arguments().size();
  if (check_aten_devices) {
    check_devices(op, *stack, first);
  }
  CallAliases call;
  // An npu generator's state is copied out and written back: hold its lock for the whole call.
  std::vector<std::unique_lock<std::mutex>> locks;
  std::vector<const c10::GeneratorImpl*> locked;
  for (size_t i = first; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isGenerator() && v.toGenerator().defined() && v.toGenerator().device().type() == kNpu) {
      const c10::GeneratorImpl* impl = v.toGenerator().unsafeGetGeneratorImpl();
      if (std::find(locked.begin(), locked.end(), impl) == locked.end()) {
        locked.push_back(impl);
        locks.emplace_back(v.toGenerator().mutex());
      }
    }
    v = args_to_cpu(v, call);
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  call.sync_back();
  const std::string name = op_name(op);
  const size_t nret = schema.returns().size();
  for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
    (*stack)[i] = results_to_npu((*stack)[i], call, name);
  }
}

// torch_npu's gather takes an int32 index as well as an int64 one; the CPU kernel only int64 (vllm-ascend's own tests
// gather block tables by int32 positions). An int32 index of aten::gather (any overload) is widened before the CPU
// kernel runs.
void widen_int32_gather_index(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (op.operator_name().name != "aten::gather") {
    return;
  }
  const auto& schema = op.schema();
  const auto index = schema.argumentIndexWithName("index");
  if (!index.has_value()) {
    return;
  }
  c10::IValue& v = (*stack)[stack->size() - schema.arguments().size() + *index];
  if (v.isTensor() && v.toTensor().scalar_type() == at::kInt) {
    v = v.toTensor().to(at::kLong);
  }
}

void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  widen_int32_gather_index(op, stack);
  // Device rules are aten's; other namespaces (custom ops) decide about CPU arguments themselves.
  run_on_cpu(op, stack, op.operator_name().name.rfind("aten::", 0) == 0);
}

void npu_c10d(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_cpu(op, stack, false);
}

// alltoall_ (a list of tensors per peer), which HCCL has and gloo lacks: one flat buffer each way through
// gloo's alltoall_base_ (per-peer split sizes), then the received parts copied into the output tensors.
void npu_alltoall(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // alltoall_(Tensor[] output_tensors, Tensor[] input_tensors, ProcessGroup process_group, int timeout)
  const size_t first = stack->size() - op.schema().arguments().size();
  const std::vector<at::Tensor> outputs = (*stack)[first].toTensorVector();
  const std::vector<at::Tensor> inputs = (*stack)[first + 1].toTensorVector();
  const c10::IValue group = (*stack)[first + 2];
  const int64_t timeout = (*stack)[first + 3].toInt();
  TORCH_CHECK(!outputs.empty() && outputs.size() == inputs.size(), "alltoall: ", inputs.size(), " input and ",
              outputs.size(), " output tensors, expected one of each per rank");
  CallAliases call;
  std::vector<at::Tensor> send_parts;
  std::vector<at::Tensor> recv_parts;
  std::vector<int64_t> send_splits;
  std::vector<int64_t> recv_splits;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(inputs[i].scalar_type() == inputs[0].scalar_type() && outputs[i].scalar_type() == inputs[0].scalar_type(),
                "alltoall: every tensor must have the dtype of the first input, ", inputs[0].scalar_type());
    send_parts.push_back((is_npu(inputs[i]) ? call.alias(inputs[i]) : inputs[i]).reshape(-1));
    recv_parts.push_back(is_npu(outputs[i]) ? call.alias(outputs[i]) : outputs[i]);
    send_splits.push_back(inputs[i].numel());
    recv_splits.push_back(outputs[i].numel());
  }
  at::Tensor send = at::cat(send_parts);
  at::Tensor recv = at::empty({std::accumulate(recv_splits.begin(), recv_splits.end(), int64_t{0})}, send.options());
  static const auto base = c10::Dispatcher::singleton().findSchemaOrThrow("c10d::alltoall_base_", "");
  torch::jit::Stack call_stack{recv, send, group, c10::IValue(recv_splits), c10::IValue(send_splits), timeout};
  base.callBoxed(&call_stack);
  const c10::IValue work = call_stack.back();
  work.toCustomClass<c10d::Work>()->wait();
  int64_t offset = 0;
  for (size_t i = 0; i < recv_parts.size(); ++i) {
    recv_parts[i].copy_(recv.narrow(0, offset, recv_splits[i]).view(recv_parts[i].sizes()));
    offset += recv_splits[i];
  }
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  stack->emplace_back(c10::List<at::Tensor>(outputs));
  stack->push_back(work);
}

// allgather_ into outputs of different sizes, which HCCL takes and gloo refuses: torch_npu's
// ProcessGroupHCCL::allgather runs one broadcast per rank when the output sizes differ (vllm-ascend's TP MoE
// gathers the uneven tensor_split chunks of a prefill this way), and so does this, over the same group. Equal
// sizes take gloo's allgather as every other collective does.
void npu_allgather(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // allgather_(Tensor[][] output_tensors, Tensor[] input_tensors, ProcessGroup process_group, int timeout)
  const size_t first = stack->size() - op.schema().arguments().size();
  const c10::List<c10::IValue> lists = (*stack)[first].toList();
  const std::vector<at::Tensor> inputs = (*stack)[first + 1].toTensorVector();
  bool uneven = false;
  for (const c10::IValue& list : lists) {
    const std::vector<at::Tensor> outs = list.toTensorVector();
    for (const at::Tensor& out : outs) {
      uneven = uneven || out.sizes() != outs.front().sizes();
    }
  }
  if (!uneven) {
    npu_c10d(op, stack);
    return;
  }
  TORCH_CHECK(lists.size() == 1 && inputs.size() == 1, "allgather: outputs of different sizes need one input tensor, got ",
              inputs.size());
  const std::vector<at::Tensor> outs = lists.get(0).toTensorVector();
  const c10::IValue group = (*stack)[first + 2];
  const int64_t timeout = (*stack)[first + 3].toInt();
  const auto pg = group.toCustomClass<c10d::ProcessGroup>();
  const int64_t rank = pg->getRank();
  TORCH_CHECK(static_cast<int64_t>(outs.size()) == pg->getSize(), "allgather: ", outs.size(),
              " output tensors for a group of ", pg->getSize());
  TORCH_CHECK(outs[rank].sizes() == inputs[0].sizes(), "allgather: this rank's output tensor has shape ",
              outs[rank].sizes(), ", its input ", inputs[0].sizes());
  outs[rank].copy_(inputs[0]);
  static const auto broadcast = c10::Dispatcher::singleton().findSchemaOrThrow("c10d::broadcast_", "");
  c10::IValue work;
  for (int64_t root = 0; root < pg->getSize(); ++root) {
    torch::jit::Stack call_stack{c10::IValue(std::vector<at::Tensor>{outs[root]}), group, root, int64_t{0}, false,
                                 timeout};
    broadcast.callBoxed(&call_stack);
    work = call_stack.back();
    work.toCustomClass<c10d::Work>()->wait();
  }
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  stack->emplace_back(lists);
  stack->push_back(work);
}

// ---- explicit kernels ----------------------------------------------------------------------------------

void check_factory(std::optional<at::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided, "npu emulation: only strided tensors, not ", *layout);
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
}

at::Tensor npu_empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                     std::optional<at::Device> device, std::optional<bool> pin_memory,
                     std::optional<at::MemoryFormat> memory_format) {
  check_factory(layout, pin_memory);
  std::optional<c10::DeviceGuard> guard;
  if (device.has_value() && device->has_index()) {
    guard.emplace(*device);
  }
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor npu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                             std::optional<at::Layout> layout, std::optional<at::Device> device,
                             std::optional<bool> pin_memory) {
  check_factory(layout, pin_memory);
  std::optional<c10::DeviceGuard> guard;
  if (device.has_value() && device->has_index()) {
    guard.emplace(*device);
  }
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::dtype_or_default(dtype));
}

// As the CPU's resize_: same sizes keep their strides; the storage grows in place when too small.
const at::Tensor& npu_resize_(const at::Tensor& self, c10::IntArrayRef size,
                              std::optional<at::MemoryFormat> memory_format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (impl->sizes() != size) {
    impl->set_sizes_contiguous(size);
    ensure_storage_bytes(self, at::detail::computeStorageNbytesContiguous(size, self.itemsize(), impl->storage_offset()));
  }
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != at::MemoryFormat::Preserve, "Unsupported memory format", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& npu_set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                            c10::IntArrayRef stride) {
  TORCH_CHECK(is_npu(self) && source.device_type() == kNpu, "set_: expected an npu tensor and an npu storage, got a ",
              self.device(), " tensor and a storage on ", source.device());
  TORCH_CHECK(storage_offset >= 0, "set_: storage_offset must be non-negative, got ", storage_offset);
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (impl->unsafe_storage().unsafeGetStorageImpl() != source.unsafeGetStorageImpl()) {
    impl->set_storage_keep_dtype(std::move(source));
  }
  impl->set_storage_offset(storage_offset);
  if (stride.empty() && !size.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  ensure_storage_bytes(self, at::detail::computeStorageNbytes(impl->sizes(), impl->strides(), self.itemsize(), storage_offset));
  return self;
}

at::Tensor& npu_set_storage_whole(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.itemsize());
  return npu_set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& npu_set_tensor(at::Tensor& self, const at::Tensor& source) {
  TORCH_CHECK(self.dtype() == source.dtype(), "Could not set tensor of type ", source.dtype(), " to a tensor of type ",
              self.dtype());
  if (!self.is_same(source)) {
    npu_set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
  }
  return self;
}

at::Tensor& npu_set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, allocate_on(self.device().index(), 0), &g_allocator, true);
  return npu_set_storage(self, std::move(storage), 0, {0}, {});
}

// Between npu and cpu in any direction, any strides and dtypes: the CPU copy over the same memory.
at::Tensor npu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  TORCH_CHECK((is_npu(self) || self.is_cpu()) && (is_npu(dst) || dst.is_cpu()),
              "npu emulation copies between npu and cpu tensors only, not from ", self.device(), " to ", dst.device());
  CallAliases call;
  const at::Tensor src = is_npu(self) ? call.alias(self) : self;
  at::Tensor out = is_npu(dst) ? call.alias(dst) : dst;
  out.copy_(src);
  return dst;
}

at::Tensor npu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    dst.resize_(self.sizes());
  }
  return npu_copy_from(self, dst, false);
}

at::Scalar npu_local_scalar_dense(const at::Tensor& self) {
  return at::_local_scalar_dense(cpu_alias(self));
}

// `param.data = other` between npu and cpu tensors, as CUDA allows it between cuda and cpu.
bool npu_has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) { return t.layout() == at::kStrided && !t.is_quantized() && (is_npu(t) || t.is_cpu()); };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) || (dense(self) && dense(from));
}

// One stream: nothing to record.
void npu_record_stream(at::Tensor& /*self*/, c10::Stream /*stream*/) {}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(npu_empty));
  m.impl("empty_strided", TORCH_FN(npu_empty_strided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("resize_", TORCH_FN(npu_resize_));
  m.impl("set_.source_Storage", TORCH_FN(npu_set_storage_whole));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(npu_set_storage));
  m.impl("set_.source_Tensor", TORCH_FN(npu_set_tensor));
  m.impl("set_", TORCH_FN(npu_set_empty));
  m.impl("_copy_from", TORCH_FN(npu_copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(npu_copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(npu_local_scalar_dense));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(npu_has_compatible_shallow_copy_type));
  m.impl("record_stream", TORCH_FN(npu_record_stream));
  // aten's default kernel for gather checks the index dtype before any backend runs: the fallback widens it first
  m.impl("gather", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
}

// A backend kernel of a CompositeImplicitAutograd op takes the op's autograd entry away: give it back.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(npu_has_compatible_shallow_copy_type));
}

// libtorch 2.5.1 registers the autograd fallback (ops without a derivative formula: c10d, custom ops) for
// AutogradCPU, AutogradCUDA, ... but not AutogradPrivateUse1; the same one serves npu tensors.
TORCH_LIBRARY_IMPL(_, AutogradPrivateUse1, m) {
  m.fallback(torch::autograd::basicAutogradNotImplementedFallback());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
}

namespace {

// libtorch registers c10d kernels for PrivateUse1 that ask the group for a PrivateUse1 backend; gloo takes
// CPU tensors only. Ours run the CPU kernels (gloo) over the npu memory instead; alltoall_, which gloo does
// not have, goes through its alltoall_base_; allgather_ into outputs of different sizes through broadcasts.
constexpr std::array<const char*, 19> kC10dOps = {
    "_allgather_base_", "_reduce_scatter_base_", "allgather_", "allgather_coalesced_",
    "allgather_into_tensor_coalesced_", "allreduce_", "allreduce_coalesced_", "alltoall_", "alltoall_base_",
    "barrier", "broadcast_", "gather_", "recv_", "recv_any_source_", "reduce_", "reduce_scatter_",
    "reduce_scatter_tensor_coalesced_", "scatter_", "send"};

// Replacing libtorch's kernels is the point, so its "Overriding a previously registered kernel" warning is
// dropped; every other warning goes on to the handler that was there.
class DropKernelOverrideWarning final : public c10::WarningHandler {
 public:
  explicit DropKernelOverrideWarning(c10::WarningHandler* next) : next_(next) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("Overriding a previously registered kernel") == std::string::npos) {
      next_->process(warning);
    }
  }

 private:
  c10::WarningHandler* next_;
};

std::mutex g_install_mutex;
bool g_installed = false;

void install() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (g_installed) {
    return;
  }
  TORCH_CHECK(!at::isPrivateUse1HooksRegistered(),
              "npu emulation: another PrivateUse1 backend already registered its hooks in this process");
  at::RegisterPrivateUse1HooksInterface(new NpuHooks());
  DropKernelOverrideWarning filter(c10::WarningUtils::get_warning_handler());
  c10::WarningUtils::WarningHandlerGuard guard(&filter);
  // Kept for the life of the process (never destroyed): its registrations must outlive every collective.
  auto* c10d = new torch::Library(torch::Library::IMPL, "c10d", c10::DispatchKey::PrivateUse1, __FILE__,
                                  static_cast<uint32_t>(__LINE__));
  for (const char* name : kC10dOps) {
    if (std::string(name) == "alltoall_") {
      c10d->impl(name, torch::CppFunction::makeFromBoxedFunction<&npu_alltoall>());
    } else if (std::string(name) == "allgather_") {
      c10d->impl(name, torch::CppFunction::makeFromBoxedFunction<&npu_allgather>());
    } else {
      c10d->impl(name, torch::CppFunction::makeFromBoxedFunction<&npu_c10d>());
    }
  }
  g_installed = true;
}

c10::DeviceIndex device_arg(int64_t device) {
  const auto index = static_cast<c10::DeviceIndex>(device < 0 ? current_index() : device);
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "npu emulation: no device ", device);
  return index;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The npu device (PrivateUse1) on a CPU host: host memory, one stream, CPU kernels.";
  m.def("install", &install, "register the hooks and the c10d kernels (once per process)");
  m.def("installed", [] { return g_installed; });
  m.def(
      "set_device",
      [](int64_t device) {
        check_index(static_cast<c10::DeviceIndex>(device));
        g_default_device.store(static_cast<int>(device));
        t_device = static_cast<int>(device);
      },
      "the process's current device (and this thread's), as torch.npu.set_device");
  m.def("current_device", [] { return static_cast<int64_t>(current_index()); });
  m.def("device_count", [] { return static_cast<int64_t>(visible_device_count()); });
  m.def("memory_allocated", [](int64_t device) { return g_allocated[device_arg(device)].load(); });
  m.def("max_memory_allocated", [](int64_t device) { return g_peak[device_arg(device)].load(); });
  m.def("reset_peak_memory_stats", [](int64_t device) {
    const auto index = device_arg(device);
    g_peak[index].store(g_allocated[index].load());
  });
  m.def("cpu_alias", &cpu_alias, "a CPU tensor over an npu tensor's memory (same sizes, strides, offset)");
  m.def("npu_alias", &npu_alias, "an npu tensor over a CPU tensor's memory (same sizes, strides, offset)");
}
