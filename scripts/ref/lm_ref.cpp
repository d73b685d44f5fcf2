// Reference model outputs from llama.cpp's public API, for akunu's inference engine tests.
//
//   lm_ref logits MODEL OUT.f32 ID...   logits at every position: f32 little-endian,
//                                       n_tokens x n_vocab, row-major
//   lm_ref greedy MODEL N ID...         the prompt ids, then N greedy steps
//   lm_ref top1   MODEL ID...           teacher forcing: the argmax at every position
//
// Options (anywhere after the command): -t THREADS (default 1), --fa auto|on|off (default auto,
// as llama.cpp's own tools). Inputs are token ids, so no tokenizer is involved. Every command
// writes one JSON line to stdout: the shape, whether llama.cpp resolved flash attention on, and
// the command's result. Argmax takes the lowest id on ties; `margin` is the argmax logit minus the
// runner-up's, so a test can tell a real disagreement from a near tie.
//
// Everything runs on the CPU backend with llama.cpp's default context settings (f16 K/V cache,
// weight repacking, flash attention as resolved by llama.cpp), except that the context is sized to
// the input and the whole prompt is a single batch and ubatch: one llama_decode call, so results do
// not depend on how a prompt would be split.

#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string & msg) {
    std::fprintf(stderr, "lm_ref: %s\n", msg.c_str());
    std::exit(1);
}

// Whether flash attention is on: as asked, or for "auto" as llama.cpp resolved it, which only its
// log tells. -1 while unknown.
int g_flash_attn = -1;

void log_cb(ggml_log_level level, const char * text, void *) {
    const char * fa = std::strstr(text, "Flash Attention");
    if (fa != nullptr) {
        if (std::strstr(fa, "not supported") != nullptr) {
            g_flash_attn = 0;
        } else if (std::strstr(fa, "enabled") != nullptr) {
            g_flash_attn = 1;
        }
    }
    if (level == GGML_LOG_LEVEL_ERROR || std::getenv("LM_REF_LOG") != nullptr) {
        std::fputs(text, stderr);
    }
}

struct options {
    int threads = 1;
    llama_flash_attn_type fa = LLAMA_FLASH_ATTN_TYPE_AUTO;
    std::vector<std::string> args;
};

options parse(int argc, char ** argv) {
    options o;
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        if ((a == "-t" || a == "--fa") && i + 1 >= argc) {
            die(a + " needs a value");
        }
        if (a == "-t") {
            o.threads = std::atoi(argv[++i]);
            if (o.threads < 1) {
                die("-t must be positive");
            }
        } else if (a == "--fa") {
            const std::string v = argv[++i];
            if (v == "auto") {
                o.fa = LLAMA_FLASH_ATTN_TYPE_AUTO;
            } else if (v == "on") {
                o.fa = LLAMA_FLASH_ATTN_TYPE_ENABLED;
            } else if (v == "off") {
                o.fa = LLAMA_FLASH_ATTN_TYPE_DISABLED;
            } else {
                die("--fa takes auto, on or off");
            }
        } else {
            o.args.push_back(a);
        }
    }
    return o;
}

std::vector<llama_token> parse_ids(const std::vector<std::string> & args, size_t from) {
    std::vector<llama_token> ids;
    for (size_t i = from; i < args.size(); ++i) {
        char * end = nullptr;
        const long v = std::strtol(args[i].c_str(), &end, 10);
        if (end == args[i].c_str() || *end != '\0' || v < 0 || v > INT32_MAX) {
            die("not a token id: " + args[i]);
        }
        ids.push_back(llama_token(v));
    }
    if (ids.empty()) {
        die("no token ids given");
    }
    return ids;
}

struct session {
    llama_model * model = nullptr;
    llama_context * ctx = nullptr;
    int32_t n_vocab = 0;

    session(const std::string & path, const options & o, uint32_t n_ctx, uint32_t n_batch) {
        llama_model_params mp = llama_model_default_params();
        mp.n_gpu_layers = 0;
        model = llama_model_load_from_file(path.c_str(), mp);
        if (model == nullptr) {
            die("cannot load " + path + " (run with LM_REF_LOG=1 for llama.cpp's log)");
        }
        n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = n_ctx;
        cp.n_batch = n_batch;
        cp.n_ubatch = n_batch;
        cp.n_threads = o.threads;
        cp.n_threads_batch = o.threads;
        cp.flash_attn_type = o.fa;
        ctx = llama_init_from_model(model, cp);
        if (ctx == nullptr) {
            die("cannot create a context for " + path);
        }
    }

    ~session() {
        llama_free(ctx);
        llama_model_free(model);
    }

    // Decodes ids at positions pos0.. in one call; logits for every position or only the last.
    void decode(const std::vector<llama_token> & ids, int32_t pos0, bool all_logits) {
        llama_batch b = llama_batch_init(int32_t(ids.size()), 0, 1);
        for (size_t i = 0; i < ids.size(); ++i) {
            if (ids[i] >= n_vocab) {
                die("token id " + std::to_string(ids[i]) + " out of range");
            }
            b.token[i] = ids[i];
            b.pos[i] = pos0 + int32_t(i);
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = all_logits || i + 1 == ids.size();
        }
        b.n_tokens = int32_t(ids.size());
        const int32_t rc = llama_decode(ctx, b);
        llama_batch_free(b);
        if (rc != 0) {
            die("llama_decode failed with " + std::to_string(rc));
        }
    }

    const float * logits(int32_t i) const {
        const float * p = llama_get_logits_ith(ctx, i);
        if (p == nullptr) {
            die("no logits for output " + std::to_string(i));
        }
        return p;
    }
};

// Context and batch sizes: the whole input in one ubatch, the context rounded up for the cache.
uint32_t ctx_for(size_t n) { return uint32_t((n + 255) / 256 * 256); }

struct top2 {
    llama_token id;
    float logit;
    float margin;
};

top2 argmax(const float * row, int32_t n_vocab) {
    llama_token best = 0;
    for (int32_t i = 1; i < n_vocab; ++i) {
        if (row[i] > row[best]) {
            best = i;
        }
    }
    float second = -INFINITY;
    for (int32_t i = 0; i < n_vocab; ++i) {
        if (i != best && row[i] > second) {
            second = row[i];
        }
    }
    return {best, row[best], row[best] - second};
}

std::string json_list(const std::vector<top2> & v, int field) {
    std::string out = "[";
    char buf[64];
    for (size_t i = 0; i < v.size(); ++i) {
        if (field == 0) {
            std::snprintf(buf, sizeof buf, "%d", v[i].id);
        } else {
            std::snprintf(buf, sizeof buf, "%.9g", double(field == 1 ? v[i].logit : v[i].margin));
        }
        out += (i ? "," : "") + std::string(buf);
    }
    return out + "]";
}

std::string header(const session & s, size_t n_tokens) {
    return "{\"n_tokens\":" + std::to_string(n_tokens) + ",\"n_vocab\":" + std::to_string(s.n_vocab) +
           ",\"flash_attn\":" + (g_flash_attn < 0 ? "null" : g_flash_attn ? "true" : "false");
}

int cmd_logits(const options & o) {
    if (o.args.size() < 3) {
        die("usage: lm_ref logits MODEL OUT.f32 ID...");
    }
    const auto ids = parse_ids(o.args, 2);
    session s(o.args[0], o, ctx_for(ids.size()), uint32_t(ids.size()));
    s.decode(ids, 0, true);
    FILE * f = std::fopen(o.args[1].c_str(), "wb");
    if (f == nullptr) {
        die("cannot write " + o.args[1]);
    }
    for (size_t i = 0; i < ids.size(); ++i) {
        if (std::fwrite(s.logits(int32_t(i)), sizeof(float), size_t(s.n_vocab), f) !=
            size_t(s.n_vocab)) {
            die("error writing " + o.args[1]);
        }
    }
    if (std::fclose(f) != 0) {
        die("error writing " + o.args[1]);
    }
    std::printf("%s}\n", header(s, ids.size()).c_str());
    return 0;
}

int cmd_greedy(const options & o) {
    if (o.args.size() < 3) {
        die("usage: lm_ref greedy MODEL N ID...");
    }
    const int n_gen = std::atoi(o.args[1].c_str());
    if (n_gen < 1) {
        die("N must be positive");
    }
    const auto prompt = parse_ids(o.args, 2);
    session s(o.args[0], o, ctx_for(prompt.size() + size_t(n_gen)), uint32_t(prompt.size()));
    std::vector<top2> steps;
    s.decode(prompt, 0, false);
    for (int i = 0; i < n_gen; ++i) {
        steps.push_back(argmax(s.logits(-1), s.n_vocab));
        if (i + 1 < n_gen) {
            s.decode({steps.back().id}, int32_t(prompt.size()) + i, false);
        }
    }
    std::printf("%s,\"ids\":%s,\"logit\":%s,\"margin\":%s}\n", header(s, prompt.size()).c_str(),
                json_list(steps, 0).c_str(), json_list(steps, 1).c_str(),
                json_list(steps, 2).c_str());
    return 0;
}

int cmd_top1(const options & o) {
    if (o.args.size() < 2) {
        die("usage: lm_ref top1 MODEL ID...");
    }
    const auto ids = parse_ids(o.args, 1);
    session s(o.args[0], o, ctx_for(ids.size()), uint32_t(ids.size()));
    s.decode(ids, 0, true);
    std::vector<top2> rows;
    for (size_t i = 0; i < ids.size(); ++i) {
        rows.push_back(argmax(s.logits(int32_t(i)), s.n_vocab));
    }
    std::printf("%s,\"ids\":%s,\"logit\":%s,\"margin\":%s}\n", header(s, ids.size()).c_str(),
                json_list(rows, 0).c_str(), json_list(rows, 1).c_str(), json_list(rows, 2).c_str());
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    llama_log_set(log_cb, nullptr);
    if (argc < 2) {
        die("usage: lm_ref {logits|greedy|top1} MODEL ... [-t THREADS] [--fa auto|on|off]");
    }
    const std::string cmd = argv[1];
    const options o = parse(argc, argv);
    if (o.fa != LLAMA_FLASH_ATTN_TYPE_AUTO) {
        g_flash_attn = o.fa == LLAMA_FLASH_ATTN_TYPE_ENABLED;
    }

    llama_backend_init();
    int rc;
    if (cmd == "logits") {
        rc = cmd_logits(o);
    } else if (cmd == "greedy") {
        rc = cmd_greedy(o);
    } else if (cmd == "top1") {
        rc = cmd_top1(o);
    } else {
        die("unknown command " + cmd);
    }
    llama_backend_free();
    return rc;
}
