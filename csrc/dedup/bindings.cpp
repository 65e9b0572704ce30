// Python bindings of the dedup loader and kernels (`iekit.runtime._native`): the
// store, and the fused GEMV over one of its members.
// The environment (IE_DEDUP_*) is read by runtime/env.py, never here.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>

#include "common/py_args.h"
#include "dedup.h"
#include "fused_product.h"

namespace py = pybind11;
namespace dd = ie::dedup;

namespace {

using U8 = py::array_t<uint8_t, py::array::c_style>;
using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

std::vector<int64_t> to_vec(const I64& a, const char* what) {
  if (a.ndim() != 1) throw std::invalid_argument(std::string("dedup: ") + what + " must be a 1-D array");
  return std::vector<int64_t>(a.data(), a.data() + a.size());
}

// A read-only uint8 view that keeps the shared buffer alive.
py::array view_of(dd::BufferPtr buf) {
  auto* keep = new dd::BufferPtr(std::move(buf));
  py::capsule owner(keep, [](void* p) { delete static_cast<dd::BufferPtr*>(p); });
  py::array out(py::dtype::of<uint8_t>(), {static_cast<py::ssize_t>((*keep)->size)}, {py::ssize_t(1)}, (*keep)->data,
                owner);
  out.attr("setflags")(py::arg("write") = false);
  return out;
}

std::unique_ptr<dd::DedupStore> make_store(const std::string& model_dir, const std::vector<std::string>& blob_names,
                                           const std::vector<int64_t>& blob_sizes, int64_t alignment,
                                           const std::vector<std::string>& names, const I64& member_group,
                                           const I64& mask_offset, const I64& mask_nbytes, const I64& exc_offset,
                                           const I64& exc_count,
                                           const I64& group_nbytes, const I64& group_default_offset,
                                           double cache_mb, int threads, bool debug, const std::string& isa,
                                           const std::string& index_label) {
  if (blob_names.size() != 3 || blob_sizes.size() != 3)
    throw std::invalid_argument("dedup: blob_names and blob_sizes need 3 entries (defaults, masks, exceptions)");
  if (!(cache_mb >= 0)) throw std::invalid_argument("dedup: cache_mb must be >= 0");
  dd::StoreSpec s;
  s.model_dir = model_dir;
  s.index_label = index_label;
  for (int b = 0; b < 3; ++b) {
    s.blob_names[b] = blob_names[b];
    s.blob_sizes[b] = blob_sizes[b];
  }
  s.alignment = alignment;
  s.names = names;
  s.member_group = to_vec(member_group, "member_group");
  s.mask_offset = to_vec(mask_offset, "mask_offset");
  s.mask_nbytes = to_vec(mask_nbytes, "mask_nbytes");
  s.exc_offset = to_vec(exc_offset, "exc_offset");
  s.exc_count = to_vec(exc_count, "exc_count");
  s.group_nbytes = to_vec(group_nbytes, "group_nbytes");
  s.group_default_offset = to_vec(group_default_offset, "group_default_offset");
  const ie::Isa chosen = ie::resolve_isa(isa);
  const size_t cache_bytes = static_cast<size_t>(cache_mb * 1048576.0);
  py::gil_scoped_release nogil;
  return std::make_unique<dd::DedupStore>(s, cache_bytes, threads, debug, chosen);
}

// The view of an n-byte default and its line mask with `exc_count`
// exceptions and `prefix` (filled and checked here when `check`, the
// loader's rules: ValueError naming the broken one; else the caller's table,
// which reconstruct() checks against every chunk's end).
dd::MemberView member_view(const U8& def, const U8& mask, size_t exc_count, std::vector<dd::Cursor>* prefix, bool check) {
  dd::MemberView v;
  v.nbytes = static_cast<size_t>(def.size());
  if (v.nbytes == 0) throw std::invalid_argument("dedup: the default is empty");
  if (!dd::split_line_mask(mask.data(), static_cast<size_t>(mask.size()), v.nbytes, &v.mask))
    throw std::invalid_argument("dedup: a " + std::to_string(mask.size()) + "-byte mask cannot be words + " +
                                std::to_string(dd::line_bits_nbytes(v.nbytes)) + " bytes of line bits");
  if (check) {
    const auto [field, msg] = dd::check_line_mask(v.mask, exc_count, prefix);
    if (!msg.empty()) throw std::invalid_argument("dedup: " + field + ": " + msg);
  }
  v.def = def.data();
  v.exc_count = exc_count;
  v.prefix = prefix;
  return v;
}

using Prefix = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;

py::array prefix_array(const std::vector<dd::Cursor>& p) {
  Prefix out({static_cast<py::ssize_t>(p.size()), py::ssize_t(2)});
  for (size_t i = 0; i < p.size(); ++i) {
    out.mutable_at(i, 0) = p[i].w;
    out.mutable_at(i, 1) = p[i].k;
  }
  return out;
}

py::array reconstruct_py(const U8& def, const U8& mask, const U8& exc, py::object prefix_obj, int threads,
                         const std::string& isa_name, int stream_stores, py::object out_obj) {
  const ie::Isa isa = ie::resolve_isa(isa_name);
  std::vector<dd::Cursor> prefix;
  if (!prefix_obj.is_none()) {  // a table from dedup_prefix: the mask was checked once there
    const Prefix p = prefix_obj.cast<Prefix>();
    if (p.ndim() != 2 || p.shape(1) != 2) throw std::invalid_argument("dedup: prefix must be a [chunks + 1, 2] array");
    for (py::ssize_t i = 0; i < p.shape(0); ++i) prefix.push_back({p.at(i, 0), p.at(i, 1)});
  }
  dd::MemberView v = member_view(def, mask, static_cast<size_t>(exc.size()), &prefix, prefix_obj.is_none());
  v.exc = exc.data();
  const size_t n = v.nbytes;
  py::array_t<uint8_t> out;
  if (out_obj.is_none()) {
    out = py::array_t<uint8_t>(static_cast<py::ssize_t>(n));
  } else {
    out = out_obj.cast<py::array_t<uint8_t>>();
    if (!(out.flags() & py::array::c_style) || static_cast<size_t>(out.size()) != n || !out.writeable())
      throw std::invalid_argument("dedup: out must be a writable contiguous uint8 array of the tensor's size");
  }
  uint8_t* o = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    dd::reconstruct(v, o, threads, isa, stream_stores);
  }
  return out;
}

py::dict stats_dict(const dd::DedupStore& s) {
  const dd::StoreStats st = s.stats();
  py::dict d;
  d["hits"] = st.hits;
  d["misses"] = st.misses;
  d["evictions"] = st.evictions;
  d["bypasses"] = st.bypasses;
  d["entries"] = st.entries;
  d["cached_bytes"] = st.cached_bytes;
  d["capacity_bytes"] = st.capacity_bytes;
  d["reconstructed_bytes"] = st.reconstructed_bytes;
  d["fused_calls"] = st.fused_calls;
  d["fused_bytes"] = st.fused_bytes;
  d["groups"] = s.groups();
  d["members"] = s.names().size();
  d["isa"] = ie::isa_name(s.isa());
  d["threads"] = s.threads();
  return d;
}

using FArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// The fused dedup GEMV over member `name` of `store` (test and bench hook;
// the decoder calls it directly).
py::array_t<float> gemv_dedup_py(ie::dedup::DedupStore& store, const std::string& name, const std::string& dtype,
                                 int64_t rows, int64_t cols, FArray x, std::optional<FArray> bias, int64_t group_size,
                                 bool symmetric, const std::string& scale_dtype, double tensor_scale, const std::string& act, int threads,
                                 const std::string& isa_name) {
  const ie::WeightSpec s = ie::make_weight_spec(dtype, rows, cols, group_size, symmetric, scale_dtype, tensor_scale);
  const ie::Act a = ie::parse_act(act);
  const ie::Isa isa = ie::resolve_isa(isa_name);
  if (!store.contains(name)) throw py::key_error(name);
  const ie::DedupMatrix m = ie::make_dedup_matrix(s, store.view(name));
  ie::ProductOperands o = ie::product_operands(x, bias, rows, cols, ie::kMaxBatch, threads);
  {
    py::gil_scoped_release nogil;
    ie::PreparedAct xa;
    xa.set(o.x, static_cast<int>(o.batch), cols);
    ie::DedupGemvScratch scratch;
    ie::ThreadPool pool(threads);
    ie::gemv_dedup(m, xa, o.bias, o.yp, a, pool, isa, scratch);
    store.count_fused(m.src.read_bytes());
  }
  return o.y;
}

}  // namespace

void ie_register_dedup(py::module_& m) {
  m.attr("DEDUP_CHUNK") = dd::kChunk;
  py::class_<dd::DedupStore>(m, "DedupStore",
                             "Serves grouped tensors from model.defaults.bin / model.masks.bin / "
                             "model.exceptions.bin, validating every index number first (ValueError "
                             "'FILE: FIELD: message' otherwise). Build it through iekit.runtime.dedup.")
      .def(py::init(&make_store), py::arg("model_dir"), py::arg("blob_names"), py::arg("blob_sizes"),
           py::arg("alignment"), py::arg("names"), py::arg("member_group"), py::arg("mask_offset"),
           py::arg("mask_nbytes"), py::arg("exc_offset"), py::arg("exc_count"), py::arg("group_nbytes"), py::arg("group_default_offset"),
           py::kw_only(), py::arg("cache_mb") = 256.0, py::arg("threads") = 0, py::arg("debug") = false,
           py::arg("isa") = "", py::arg("index_label") = "model.dedup.json")
      .def(
          "get",
          [](dd::DedupStore& s, const std::string& name) {
            if (!s.contains(name)) throw py::key_error(name);
            dd::BufferPtr buf;
            {
              py::gil_scoped_release nogil;
              buf = s.get(name);
            }
            return view_of(std::move(buf));
          },
          py::arg("name"), "The tensor's bytes (read-only uint8 array), from the LRU cache or reconstructed.")
      .def(
          "read_into",
          [](const dd::DedupStore& s, const std::string& name, size_t offset, py::array_t<uint8_t> out) {
            if (!s.contains(name)) throw py::key_error(name);
            if (!(out.flags() & py::array::c_style) || !out.writeable())
              throw std::invalid_argument("dedup: out must be a writable contiguous uint8 array");
            const dd::MemberView v = s.view(name);
            const size_t n = static_cast<size_t>(out.size());
            if (offset > v.nbytes || n > v.nbytes - offset)
              throw std::invalid_argument("dedup: bytes [" + std::to_string(offset) + ", +" + std::to_string(n) +
                                          ") are past the end of " + name + " (" + std::to_string(v.nbytes) + " bytes)");
            uint8_t* o = out.mutable_data();
            bool ok;
            {
              py::gil_scoped_release nogil;
              dd::Cursor c = dd::cursor_at(v, offset);
              ok = dd::reconstruct_range(v, c, offset, offset + n, o, s.isa());
            }
            if (!ok) throw std::invalid_argument("dedup: " + name + ": mask bits and exceptions disagree");
          },
          py::arg("name"), py::arg("offset"), py::arg("out"),
          "Rebuilds bytes [offset, offset + len(out)) of the member into `out` (a streamed read: no whole copy, "
          "not cached, not counted in stats()).")
      .def("__contains__", &dd::DedupStore::contains)
      .def("__len__", [](const dd::DedupStore& s) { return s.names().size(); })
      .def("names", &dd::DedupStore::names, "Grouped tensor names, in index order.")
      .def(
          "nbytes",
          [](const dd::DedupStore& s, const std::string& name) {
            if (!s.contains(name)) throw py::key_error(name);
            return s.nbytes(name);
          },
          py::arg("name"))
      .def(
          "read_bytes",
          [](const dd::DedupStore& s, const std::string& name) {
            if (!s.contains(name)) throw py::key_error(name);
            return s.view(name).read_bytes();
          },
          py::arg("name"), "Bytes one pass over the member reads: default + mask region + exceptions (what a fused "
                           "product of it reads; counted in stats()' fused_bytes).")
      .def(
          "cacheable",
          [](const dd::DedupStore& s, const std::string& name) {
            if (!s.contains(name)) throw py::key_error(name);
            return s.cacheable(name);
          },
          py::arg("name"), "Whether the LRU cache keeps the member once rebuilt (it fits in the cache); else "
                           "the decoder multiplies it through the fused GEMV.")
      .def("stats", &stats_dict, "Cache counters (hits, misses, evictions, bypasses, bytes) and the kernel in use.")
      .def("clear_cache", &dd::DedupStore::clear_cache);

  m.def(
      "dedup_prefix",
      [](const U8& def, const U8& mask, size_t exc_count) {
        std::vector<dd::Cursor> prefix;
        member_view(def, mask, exc_count, &prefix, true);
        return prefix_array(prefix);
      },
      py::arg("default"), py::arg("mask"), py::arg("exc_count"),
      "The line mask checked against the default's size and exc_count exceptions (ValueError naming the rule), "
      "and its prefix table: [chunks + 1, 2] (words, exceptions) before each DEDUP_CHUNK-byte chunk.");
  m.def("dedup_reconstruct", &reconstruct_py, py::arg("default"), py::arg("mask"), py::arg("exceptions"),
        py::kw_only(), py::arg("prefix") = py::none(), py::arg("threads") = 1, py::arg("isa") = "",
        py::arg("stream_stores") = -1, py::arg("out") = py::none(),
        "out[i] = mask bit i ? exceptions[k++] : default[i] for a line mask (docs/formats/dedup.md) with the "
        "selected kernel (test and bench hook). ValueError naming the rule if mask and exceptions disagree.");
  m.def("gemv_dedup", &gemv_dedup_py, py::arg("store"), py::arg("name"), py::arg("dtype"), py::arg("rows"),
        py::arg("cols"), py::arg("x"), py::arg("bias") = py::none(), py::arg("group_size") = 0,
        py::arg("symmetric") = true, py::arg("scale_dtype") = "f16", py::arg("tensor_scale") = 1.0, py::arg("act") = "f32", py::arg("threads") = 1,
        py::arg("isa") = "",
        "y = W x (+ bias) for the dedup member `name` of `store`, rebuilt a kernel step at a time inside the "
        "product (never whole); counted in store.stats() as a fused call.");
}
