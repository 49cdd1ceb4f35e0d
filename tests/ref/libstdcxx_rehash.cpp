// The facts src/tokenizer/libstdcxx.rs copies from GNU libstdc++'s std::unordered_map, the
// container of llama.cpp's token_to_id (whose iteration order picks eot/eom/fim tokens).
//   g++ -O2 -o /tmp/libstdcxx_rehash tests/ref/libstdcxx_rehash.cpp && /tmp/libstdcxx_rehash
// prints: the bucket count after each growth ("size bucket_count"; REHASH there), two
// std::hash<std::string> values, and the first 12 keys in iteration order of maps filled with
// m[std::to_string(i)] = i for i < n (n = 1000 and 200000; the unit tests there).
#include <cstdio>
#include <string>
#include <unordered_map>

int main() {
    std::unordered_map<std::string, int> m;
    size_t last = m.bucket_count();
    printf("initial %zu\n", last);
    for (int i = 0; i < (1 << 22); i++) {
        m[std::to_string(i)] = i;
        if (m.bucket_count() != last) {
            last = m.bucket_count();
            printf("%zu %zu\n", m.size(), last);
        }
    }
    printf("hash abc %zu\n", std::hash<std::string>{}("abc"));
    printf("hash long %zu\n", std::hash<std::string>{}("<|im_end|> hello world"));
    for (int n : {1000, 200000}) {
        std::unordered_map<std::string, int> t;
        for (int i = 0; i < n; i++) t[std::to_string(i)] = i;
        printf("order %d:", n);
        int k = 0;
        for (auto & e : t) {
            if (k++ == 12) break;
            printf(" %d", e.second);
        }
        printf("\n");
    }
}
