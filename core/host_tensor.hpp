#pragma once
// Owning, contiguous, row-major host buffer with a shape. The layout of a state tensor
// (K-major or V-major) is a property of the Problem, not of the buffer: the buffer is always
// row-major over the shape it is given.
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace gdn {

using Shape = std::vector<std::int64_t>;

inline std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

inline std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The multi-index of flat row-major position `flat` in `shape`, as "[i, j, k]" ("[-]" for a
// negative position): how messages name one element.
inline std::string index_string(const Shape& shape, std::int64_t flat) {
  if (flat < 0) return "[-]";
  std::vector<std::int64_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    const std::int64_t extent = shape[d] > 1 ? shape[d] : 1;
    index[d] = flat % extent;
    flat /= extent;
  }
  std::string s = "[";
  for (std::size_t d = 0; d < index.size(); ++d) s += (d ? ", " : "") + std::to_string(index[d]);
  return s + "]";
}

template <class T>
class HostTensor {
 public:
  using value_type = T;

  HostTensor() = default;
  explicit HostTensor(Shape shape, T fill = T(0)) : shape_(std::move(shape)) {
    for (std::int64_t d : shape_)
      if (d < 0) throw std::invalid_argument("HostTensor: negative extent in " + shape_string(shape_));
    data_.assign(static_cast<std::size_t>(shape_numel(shape_)), fill);
  }

  const Shape& shape() const { return shape_; }
  std::int64_t dim(std::size_t axis) const { return shape_.at(axis); }
  std::size_t rank() const { return shape_.size(); }
  std::int64_t numel() const { return static_cast<std::int64_t>(data_.size()); }
  // A tensor that was never given a shape; distinct from a shaped tensor with zero elements.
  bool defined() const { return !shape_.empty(); }

  T* data() { return data_.data(); }
  const T* data() const { return data_.data(); }
  T& operator[](std::int64_t i) { return data_[static_cast<std::size_t>(i)]; }
  const T& operator[](std::int64_t i) const { return data_[static_cast<std::size_t>(i)]; }
  std::vector<T>& storage() { return data_; }
  const std::vector<T>& storage() const { return data_; }

  template <class U>
  HostTensor<U> cast() const {
    HostTensor<U> out;
    out.shape_ = shape_;
    out.data_.resize(data_.size());
    for (std::size_t i = 0; i < data_.size(); ++i) out.data_[i] = static_cast<U>(data_[i]);
    return out;
  }

  bool operator==(const HostTensor& other) const {
    return shape_ == other.shape_ && data_ == other.data_;
  }

 private:
  template <class U>
  friend class HostTensor;
  Shape shape_;
  std::vector<T> data_;
};

}  // namespace gdn
