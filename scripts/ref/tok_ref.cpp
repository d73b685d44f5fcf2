// Reference tokenizer outputs from llama.cpp's public API, for akunu-tokenizer's tests.
//
//   tok_ref tokenize MODEL CASES OUT [--no-parse-special]
//   tok_ref pieces   MODEL OUT
//   tok_ref detok    MODEL CASES OUT
//   tok_ref info     MODEL OUT
//   tok_ref bench    MODEL FILE ITERS [--no-parse-special]
//
// CASES files are sequences of records. For `tokenize` a record is [u32 n][n bytes of text]; for
// `detok` it is [u32 n][n u32 token ids]; all integers little-endian. Outputs are JSON lines, one
// per record (or per token id for `pieces`), in input order. Byte strings are hex-encoded because
// pieces and detokenized text need not be valid UTF-8.
//
// Only the vocabulary is loaded (vocab_only), so no backend or weights are involved.

#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string & msg) {
    std::fprintf(stderr, "tok_ref: %s\n", msg.c_str());
    std::exit(1);
}

std::string read_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        die("cannot open " + path);
    }
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

uint32_t read_u32(const std::string & data, size_t & pos) {
    if (pos + 4 > data.size()) {
        die("truncated record header");
    }
    const auto * p = reinterpret_cast<const unsigned char *>(data.data() + pos);
    pos += 4;
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

std::vector<std::string> read_text_cases(const std::string & path) {
    const std::string data = read_file(path);
    std::vector<std::string> cases;
    size_t pos = 0;
    while (pos < data.size()) {
        const uint32_t n = read_u32(data, pos);
        if (pos + n > data.size()) {
            die("truncated text record in " + path);
        }
        cases.emplace_back(data, pos, n);
        pos += n;
    }
    return cases;
}

std::vector<std::vector<llama_token>> read_id_cases(const std::string & path) {
    const std::string data = read_file(path);
    std::vector<std::vector<llama_token>> cases;
    size_t pos = 0;
    while (pos < data.size()) {
        const uint32_t n = read_u32(data, pos);
        std::vector<llama_token> ids;
        ids.reserve(n);
        for (uint32_t i = 0; i < n; ++i) {
            ids.push_back(llama_token(read_u32(data, pos)));
        }
        cases.push_back(std::move(ids));
    }
    return cases;
}

std::string hex(const std::string & bytes) {
    static const char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(bytes.size() * 2);
    for (const unsigned char c : bytes) {
        out.push_back(digits[c >> 4]);
        out.push_back(digits[c & 15]);
    }
    return out;
}

std::string json_ids(const std::vector<llama_token> & ids) {
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i > 0) {
            out += ',';
        }
        out += std::to_string(ids[i]);
    }
    return out + "]";
}

// The text length is an int32 in the API; records are far smaller, but say so rather than wrap.
int32_t checked_len(size_t n) {
    if (n > size_t(INT32_MAX)) {
        die("input too large for the llama.cpp API");
    }
    return int32_t(n);
}

// Same two-call protocol as common_tokenize: a negative result is the size actually needed.
std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text,
                                  bool add_special, bool parse_special) {
    const int32_t len = checked_len(text.size());
    std::vector<llama_token> ids(text.size() + 2);
    int32_t n = llama_tokenize(vocab, text.data(), len, ids.data(), checked_len(ids.size()),
                               add_special, parse_special);
    if (n == INT32_MIN) {
        die("tokenization result exceeds int32");
    }
    if (n < 0) {
        ids.resize(size_t(-n));
        const int32_t again = llama_tokenize(vocab, text.data(), len, ids.data(),
                                             checked_len(ids.size()), add_special, parse_special);
        if (again != -n) {
            die("llama_tokenize returned different sizes for the same input");
        }
        n = again;
    }
    ids.resize(size_t(n));
    return ids;
}

std::string piece(const llama_vocab * vocab, llama_token id, bool special) {
    std::string buf(16, '\0');
    int32_t n = llama_token_to_piece(vocab, id, buf.data(), checked_len(buf.size()), 0, special);
    if (n < 0) {
        buf.resize(size_t(-n));
        n = llama_token_to_piece(vocab, id, buf.data(), checked_len(buf.size()), 0, special);
        if (n < 0) {
            die("llama_token_to_piece failed twice for token " + std::to_string(id));
        }
    }
    buf.resize(size_t(n));
    return buf;
}

// A too-small buffer is reported as the size before llama.cpp's space clean-up, so the second call
// may return less than it asked for; only a second negative result is an error.
std::string detokenize(const llama_vocab * vocab, const std::vector<llama_token> & ids,
                       bool remove_special, bool unparse_special) {
    const int32_t n_ids = checked_len(ids.size());
    std::string buf(ids.size() * 8 + 16, '\0');
    int32_t n = llama_detokenize(vocab, ids.data(), n_ids, buf.data(), checked_len(buf.size()),
                                 remove_special, unparse_special);
    if (n < 0) {
        buf.resize(size_t(-n));
        n = llama_detokenize(vocab, ids.data(), n_ids, buf.data(), checked_len(buf.size()),
                             remove_special, unparse_special);
        if (n < 0) {
            die("llama_detokenize failed twice");
        }
    }
    buf.resize(size_t(n));
    return buf;
}

struct model_handle {
    llama_model * model = nullptr;
    const llama_vocab * vocab = nullptr;

    explicit model_handle(const std::string & path) {
        llama_model_params params = llama_model_default_params();
        params.vocab_only = true;
        model = llama_model_load_from_file(path.c_str(), params);
        if (model == nullptr) {
            die("cannot load " + path + " (run with TOK_REF_LOG=1 for llama.cpp's log)");
        }
        vocab = llama_model_get_vocab(model);
    }

    ~model_handle() { llama_model_free(model); }
};

FILE * open_out(const std::string & path) {
    FILE * f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) {
        die("cannot write " + path);
    }
    return f;
}

void close_out(FILE * f, const std::string & path) {
    if (std::fclose(f) != 0) {
        die("error writing " + path);
    }
}

bool take_flag(std::vector<std::string> & args, const std::string & flag) {
    const auto it = std::find(args.begin(), args.end(), flag);
    if (it == args.end()) {
        return false;
    }
    args.erase(it);
    return true;
}

int cmd_tokenize(const std::vector<std::string> & args, bool parse_special) {
    if (args.size() != 3) {
        die("usage: tok_ref tokenize MODEL CASES OUT [--no-parse-special]");
    }
    const model_handle m(args[0]);
    // llama-tokenize passes the vocabulary's add_bos as add_special; "with_special" mirrors it.
    const bool add_special = llama_vocab_get_add_bos(m.vocab);
    const auto cases = read_text_cases(args[1]);
    FILE * out = open_out(args[2]);
    for (const auto & text : cases) {
        const auto with = tokenize(m.vocab, text, add_special, parse_special);
        const auto without = tokenize(m.vocab, text, false, parse_special);
        std::fprintf(out, "{\"with_special\":%s,\"without_special\":%s}\n", json_ids(with).c_str(),
                     json_ids(without).c_str());
    }
    close_out(out, args[2]);
    return 0;
}

int cmd_pieces(const std::vector<std::string> & args) {
    if (args.size() != 2) {
        die("usage: tok_ref pieces MODEL OUT");
    }
    const model_handle m(args[0]);
    const int32_t n_tokens = llama_vocab_n_tokens(m.vocab);
    FILE * out = open_out(args[1]);
    for (llama_token id = 0; id < n_tokens; ++id) {
        std::fprintf(out, "{\"s\":\"%s\",\"n\":\"%s\",\"attr\":%d}\n",
                     hex(piece(m.vocab, id, true)).c_str(), hex(piece(m.vocab, id, false)).c_str(),
                     int(llama_vocab_get_attr(m.vocab, id)));
    }
    close_out(out, args[1]);
    return 0;
}

int cmd_detok(const std::vector<std::string> & args) {
    if (args.size() != 3) {
        die("usage: tok_ref detok MODEL CASES OUT");
    }
    const model_handle m(args[0]);
    const auto cases = read_id_cases(args[1]);
    const int32_t n_tokens = llama_vocab_n_tokens(m.vocab);
    FILE * out = open_out(args[2]);
    for (const auto & ids : cases) {
        for (const llama_token id : ids) {
            if (id < 0 || id >= n_tokens) {
                die("token id " + std::to_string(id) + " out of range");
            }
        }
        // Keys name the (remove_special, unparse_special) flags.
        std::fprintf(out, "{\"r0u0\":\"%s\",\"r0u1\":\"%s\",\"r1u0\":\"%s\",\"r1u1\":\"%s\"}\n",
                     hex(detokenize(m.vocab, ids, false, false)).c_str(),
                     hex(detokenize(m.vocab, ids, false, true)).c_str(),
                     hex(detokenize(m.vocab, ids, true, false)).c_str(),
                     hex(detokenize(m.vocab, ids, true, true)).c_str());
    }
    close_out(out, args[2]);
    return 0;
}

int cmd_info(const std::vector<std::string> & args) {
    if (args.size() != 2) {
        die("usage: tok_ref info MODEL OUT");
    }
    const model_handle m(args[0]);
    const llama_vocab * v = m.vocab;
    const int32_t n_tokens = llama_vocab_n_tokens(v);
    std::vector<llama_token> eog;
    for (llama_token id = 0; id < n_tokens; ++id) {
        if (llama_vocab_is_eog(v, id)) {
            eog.push_back(id);
        }
    }
    FILE * out = open_out(args[1]);
    auto flag = [](bool b) { return b ? "true" : "false"; };
    std::fprintf(out,
                 "{\"type\":%d,\"n_tokens\":%d,\"bos\":%d,\"eos\":%d,\"eot\":%d,\"sep\":%d,"
                 "\"nl\":%d,\"pad\":%d,\"mask\":%d,\"add_bos\":%s,\"add_eos\":%s,"
                 "\"add_sep\":%s,\"eog\":%s}\n",
                 int(llama_vocab_type(v)), n_tokens, llama_vocab_bos(v), llama_vocab_eos(v),
                 llama_vocab_eot(v), llama_vocab_sep(v), llama_vocab_nl(v), llama_vocab_pad(v),
                 llama_vocab_mask(v), flag(llama_vocab_get_add_bos(v)),
                 flag(llama_vocab_get_add_eos(v)), flag(llama_vocab_get_add_sep(v)),
                 json_ids(eog).c_str());
    close_out(out, args[1]);
    return 0;
}

int cmd_bench(const std::vector<std::string> & args, bool parse_special) {
    if (args.size() != 3) {
        die("usage: tok_ref bench MODEL FILE ITERS [--no-parse-special]");
    }
    const model_handle m(args[0]);
    const std::string text = read_file(args[1]);
    const int iters = std::atoi(args[2].c_str());
    if (iters < 1) {
        die("ITERS must be positive");
    }
    // Size the buffer once so that every timed call is a single successful llama_tokenize.
    const auto ids = tokenize(m.vocab, text, true, parse_special);
    std::vector<llama_token> buf(ids.size());
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        const int32_t n = llama_tokenize(m.vocab, text.data(), checked_len(text.size()), buf.data(),
                                         checked_len(buf.size()), true, parse_special);
        const auto t1 = std::chrono::steady_clock::now();
        if (n != int32_t(ids.size())) {
            die("llama_tokenize is not deterministic");
        }
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const size_t k = ms.size();
    const double median = k % 2 ? ms[k / 2] : (ms[k / 2 - 1] + ms[k / 2]) / 2;
    std::printf("{\"tokens\":%zu,\"bytes\":%zu,\"iters\":%d,\"min_ms\":%.4f,\"median_ms\":%.4f}\n",
                ids.size(), text.size(), iters, ms.front(), median);
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    // llama.cpp logs every load at INFO level on stderr; that would bury real errors.
    if (std::getenv("TOK_REF_LOG") == nullptr) {
        llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    }
    if (argc < 2) {
        die("usage: tok_ref {tokenize|pieces|detok|info|bench} ...");
    }
    const std::string cmd = argv[1];
    std::vector<std::string> args(argv + 2, argv + argc);
    const bool parse_special = !take_flag(args, "--no-parse-special");

    llama_backend_init();
    int rc;
    if (cmd == "tokenize") {
        rc = cmd_tokenize(args, parse_special);
    } else if (cmd == "pieces") {
        rc = cmd_pieces(args);
    } else if (cmd == "detok") {
        rc = cmd_detok(args);
    } else if (cmd == "info") {
        rc = cmd_info(args);
    } else if (cmd == "bench") {
        rc = cmd_bench(args, parse_special);
    } else {
        die("unknown command " + cmd);
    }
    llama_backend_free();
    return rc;
}
