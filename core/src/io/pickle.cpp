// The data-only unpickler of pickle.hpp. Opcode values and argument layouts: CPython's
// Lib/pickletools.py (the authoritative opcode table) and Lib/pickle.py (the Pickler that
// writes them: protocol 4 frames its output with FRAME and memoizes with MEMOIZE; containers
// are written empty, memoized, then filled with MARK … APPENDS / SETITEMS in batches of 1,000).
#include "gpumem/pickle.hpp"

#include <cstdio>
#include <cstring>
#include <unordered_map>

namespace gpumem::pickle {

namespace {

// The opcodes that would make the unpickler look up or call Python objects, with their
// pickletools names: refused by name so that a person sees what the file asked for.
const char* ForbiddenName(unsigned char op) {
  switch (op) {
    case 'c': return "GLOBAL";
    case 0x93: return "STACK_GLOBAL";
    case 'R': return "REDUCE";
    case 'b': return "BUILD";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

// Valid opcodes outside the supported subset (text protocols 0–1, sets): named, refused.
const char* UnsupportedName(unsigned char op) {
  switch (op) {
    case 'I': return "INT";
    case 'L': return "LONG";
    case 'F': return "FLOAT";
    case 'S': return "STRING";
    case 'V': return "UNICODE";
    case 'p': return "PUT";
    case 'g': return "GET";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "FROZENSET";
    case 0x91: return "ADDITEMS";
    default: return nullptr;
  }
}

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}

  Result Run() {
    Result result;
    if (in_.size() > kMaxPickleBytes) {
      result.error = "the file is " + std::to_string(in_.size()) + " bytes; snapshots are read up to " +
                     std::to_string(kMaxPickleBytes >> 20) + " MiB";
      return result;
    }
    while (error_.empty()) {
      if (pos_ >= in_.size()) {
        Fail("the pickle ends before its STOP opcode (truncated file?)");
        break;
      }
      opAt_ = pos_;
      const unsigned char op = static_cast<unsigned char>(in_[pos_++]);
      if (op == '.') {  // STOP
        if (stack_.size() != 1 || !marks_.empty()) {
          Fail("STOP with " + std::to_string(stack_.size()) + " values on the stack (expected one)");
          break;
        }
        doc_.root = stack_.back();
        result.document = std::move(doc_);
        return result;
      }
      Step(op);
    }
    result.error = error_;
    return result;
  }

 private:
  void Fail(std::string message) {
    if (error_.empty()) error_ = "pickle byte " + std::to_string(opAt_) + ": " + message;
  }

  bool Need(std::uint64_t n) {
    if (in_.size() - pos_ < n) {
      Fail("truncated: the opcode needs " + std::to_string(n) + " more bytes, " +
           std::to_string(in_.size() - pos_) + " remain");
      return false;
    }
    return true;
  }
  std::uint64_t LittleEndian(std::size_t n) {  // after Need(n)
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }

  // A new value; nullptr (with the error set) past kMaxPickleNodes.
  Node* NewNode(Kind kind) {
    if (doc_.nodes.size() >= kMaxPickleNodes) {
      Fail("more than " + std::to_string(kMaxPickleNodes) + " values");
      return nullptr;
    }
    doc_.nodes.emplace_back().kind = kind;
    return &doc_.nodes.back();
  }
  void Push(Kind kind, std::int64_t integer = 0) {
    if (Node* n = NewNode(kind)) {
      n->integer = integer;
      stack_.push_back(static_cast<std::uint32_t>(doc_.nodes.size() - 1));
    }
  }
  void PushText(std::size_t lengthBytes, Kind kind) {
    if (!Need(lengthBytes)) return;
    const std::uint64_t length = LittleEndian(lengthBytes);
    if (!Need(length)) return;
    Node* n = NewNode(kind);
    if (!n) return;
    if (kind == Kind::String) n->text = in_.substr(pos_, length);
    else n->byteSize = length;
    pos_ += length;
    stack_.push_back(static_cast<std::uint32_t>(doc_.nodes.size() - 1));
  }
  bool Pop(std::uint32_t& id) {
    const std::size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() <= floor) {
      Fail("a value is needed but the stack is empty");
      return false;
    }
    id = stack_.back();
    stack_.pop_back();
    return true;
  }
  // Items pushed since the last MARK, removed from the stack (with the mark).
  bool PopMark(std::vector<std::uint32_t>& items) {
    if (marks_.empty()) {
      Fail("an opcode needs a MARK and there is none");
      return false;
    }
    const std::size_t mark = marks_.back();
    marks_.pop_back();
    items.assign(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return true;
  }
  // The container below the items of a MARK (APPENDS, SETITEMS), checked to be of `kind`.
  Node* Target(Kind kind, const char* opName) {
    const std::size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() <= floor) {
      Fail(std::string(opName) + " has no container to fill");
      return nullptr;
    }
    Node& n = doc_.nodes[stack_.back()];
    if (n.kind != kind) {
      Fail(std::string(opName) + " applied to a " + KindName(n.kind) + ", expected a " + KindName(kind));
      return nullptr;
    }
    return &n;
  }
  void MakeContainer(Kind kind, std::vector<std::uint32_t> items) {
    if (kind == Kind::Dict && items.size() % 2 != 0) {
      Fail("a dict needs key/value pairs, got an odd count");
      return;
    }
    if (Node* n = NewNode(kind)) {
      n->items = std::move(items);
      stack_.push_back(static_cast<std::uint32_t>(doc_.nodes.size() - 1));
    }
  }
  void Memo(std::uint32_t index) {
    if (stack_.empty()) {
      Fail("memoizing with an empty stack");
      return;
    }
    memo_[index] = stack_.back();
  }
  void Recall(std::uint32_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) {
      Fail("memo entry " + std::to_string(index) + " was never stored");
      return;
    }
    stack_.push_back(it->second);
  }

  void Step(unsigned char op) {
    std::vector<std::uint32_t> items;
    std::uint32_t id = 0;
    switch (op) {
      case 0x80:  // PROTO n
        if (Need(1)) {
          const unsigned version = static_cast<unsigned char>(in_[pos_++]);
          if (version < 2 || version > 5) Fail("pickle protocol " + std::to_string(version) + " (2 to 5 are read)");
        }
        return;
      case 0x95:  // FRAME: an 8-byte length; framing only groups what follows
        if (Need(8)) {
          const std::uint64_t length = LittleEndian(8);
          if (length > in_.size() - pos_) Fail("a FRAME longer than the rest of the file (truncated?)");
        }
        return;
      case 'N': Push(Kind::None); return;
      case 0x88: Push(Kind::Bool, 1); return;  // NEWTRUE
      case 0x89: Push(Kind::Bool, 0); return;  // NEWFALSE
      case 'K':                                // BININT1
        if (Need(1)) Push(Kind::Int, static_cast<std::int64_t>(LittleEndian(1)));
        return;
      case 'M':  // BININT2
        if (Need(2)) Push(Kind::Int, static_cast<std::int64_t>(LittleEndian(2)));
        return;
      case 'J':  // BININT: 4-byte signed
        if (Need(4)) Push(Kind::Int, static_cast<std::int32_t>(static_cast<std::uint32_t>(LittleEndian(4))));
        return;
      case 0x8a:  // LONG1: 1-byte length, little-endian two's complement
      case 0x8b: {  // LONG4: 4-byte length
        const std::size_t lengthBytes = op == 0x8a ? 1 : 4;
        if (!Need(lengthBytes)) return;
        const std::uint64_t length = LittleEndian(lengthBytes);
        if (op == 0x8b && (length >> 31) != 0) {
          Fail("LONG4 with a negative length");
          return;
        }
        if (!Need(length)) return;
        if (length > 8) {  // beyond int64: kept as "a big integer" of this many bytes
          Node* n = NewNode(Kind::BigInt);
          if (!n) return;
          n->byteSize = length;
          pos_ += length;
          stack_.push_back(static_cast<std::uint32_t>(doc_.nodes.size() - 1));
          return;
        }
        std::uint64_t v = LittleEndian(length);
        if (length > 0 && length < 8 && (v >> (8 * length - 1)) & 1) v |= ~std::uint64_t{0} << (8 * length);
        Push(Kind::Int, static_cast<std::int64_t>(v));
        return;
      }
      case 'G':  // BINFLOAT: 8-byte big-endian IEEE 754
        if (Need(8)) {
          std::uint64_t bits = 0;
          for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(in_[pos_ + i]);
          pos_ += 8;
          Push(Kind::Float);
          if (error_.empty()) std::memcpy(&doc_.nodes.back().real, &bits, sizeof bits);
        }
        return;
      case 0x8c: PushText(1, Kind::String); return;  // SHORT_BINUNICODE
      case 'X': PushText(4, Kind::String); return;   // BINUNICODE
      case 0x8d: PushText(8, Kind::String); return;  // BINUNICODE8
      case 'U': PushText(1, Kind::String); return;   // SHORT_BINSTRING (Python 2 str)
      case 'T': PushText(4, Kind::String); return;   // BINSTRING
      case 'C': PushText(1, Kind::Bytes); return;    // SHORT_BINBYTES
      case 'B': PushText(4, Kind::Bytes); return;    // BINBYTES
      case 0x8e: PushText(8, Kind::Bytes); return;   // BINBYTES8
      case 0x96: PushText(8, Kind::Bytes); return;   // BYTEARRAY8
      case '}': MakeContainer(Kind::Dict, {}); return;   // EMPTY_DICT
      case ']': MakeContainer(Kind::List, {}); return;   // EMPTY_LIST
      case ')': MakeContainer(Kind::Tuple, {}); return;  // EMPTY_TUPLE
      case '(':  // MARK
        if (marks_.size() >= kMaxPickleDepth) {
          Fail("nested deeper than " + std::to_string(kMaxPickleDepth) + " levels");
          return;
        }
        marks_.push_back(stack_.size());
        return;
      case 'd': if (PopMark(items)) MakeContainer(Kind::Dict, std::move(items)); return;   // DICT
      case 'l': if (PopMark(items)) MakeContainer(Kind::List, std::move(items)); return;   // LIST
      case 't': if (PopMark(items)) MakeContainer(Kind::Tuple, std::move(items)); return;  // TUPLE
      case 0x85: case 0x86: case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
        const std::size_t n = op - 0x84u;
        items.resize(n);
        for (std::size_t i = n; i-- > 0;)
          if (!Pop(items[i])) return;
        MakeContainer(Kind::Tuple, std::move(items));
        return;
      }
      case 'a':  // APPEND
        if (!Pop(id)) return;
        if (Node* list = Target(Kind::List, "APPEND")) list->items.push_back(id);
        return;
      case 'e':  // APPENDS
        if (!PopMark(items)) return;
        if (Node* list = Target(Kind::List, "APPENDS")) list->items.insert(list->items.end(), items.begin(), items.end());
        return;
      case 's': {  // SETITEM
        std::uint32_t key = 0;
        if (!Pop(id) || !Pop(key)) return;
        if (Node* dict = Target(Kind::Dict, "SETITEM")) {
          dict->items.push_back(key);
          dict->items.push_back(id);
        }
        return;
      }
      case 'u':  // SETITEMS
        if (!PopMark(items)) return;
        if (items.size() % 2 != 0) {
          Fail("SETITEMS needs key/value pairs, got an odd count");
          return;
        }
        if (Node* dict = Target(Kind::Dict, "SETITEMS")) dict->items.insert(dict->items.end(), items.begin(), items.end());
        return;
      case '0': Pop(id); return;  // POP
      case '1':                   // POP_MARK
        PopMark(items);
        return;
      case '2':  // DUP
        if (Pop(id)) {
          stack_.push_back(id);
          stack_.push_back(id);
        }
        return;
      case 0x94:  // MEMOIZE: the next memo index
        Memo(static_cast<std::uint32_t>(memo_.size()));
        return;
      case 'q': if (Need(1)) Memo(static_cast<std::uint32_t>(LittleEndian(1))); return;  // BINPUT
      case 'r': if (Need(4)) Memo(static_cast<std::uint32_t>(LittleEndian(4))); return;  // LONG_BINPUT
      case 'h': if (Need(1)) Recall(static_cast<std::uint32_t>(LittleEndian(1))); return;  // BINGET
      case 'j': if (Need(4)) Recall(static_cast<std::uint32_t>(LittleEndian(4))); return;  // LONG_BINGET
      default: break;
    }
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", op);
    if (const char* name = ForbiddenName(op)) {
      Fail(std::string("opcode ") + name + " (" + hex + ") would import or call Python code; a memory snapshot " +
           "holds only dicts, lists, strings and numbers, so the file is refused (nothing was executed)");
    } else if (const char* name2 = UnsupportedName(op)) {
      Fail(std::string("opcode ") + name2 + " (" + hex + ") is not read (pickle protocols 2 to 5 as Python writes snapshots)");
    } else {
      Fail(std::string("unknown opcode ") + hex + " (not a pickle, or a damaged one)");
    }
  }

  std::string_view in_;
  std::size_t pos_ = 0;
  std::size_t opAt_ = 0;
  std::string error_;
  Document doc_;
  std::vector<std::uint32_t> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint32_t, std::uint32_t> memo_;
};

}  // namespace

const Node* Document::Get(const Node& dict, std::string_view key) const {
  if (dict.kind != Kind::Dict) return nullptr;
  for (std::size_t i = 0; i + 1 < dict.items.size(); i += 2) {
    const Node& k = nodes[dict.items[i]];
    if (k.kind == Kind::String && k.text == key) return &nodes[dict.items[i + 1]];
  }
  return nullptr;
}

Result Unpickle(std::string_view bytes) { return Reader(bytes).Run(); }

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::BigInt: return "int beyond 64 bits";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Bytes: return "bytes";
    case Kind::List: return "list";
    case Kind::Tuple: return "tuple";
    case Kind::Dict: return "dict";
  }
  return "value";
}

}  // namespace gpumem::pickle
