#!/bin/sh
# The include rule of lib/README, checked from the #include lines: a folder
# of lib/ includes only its own headers and those of the folders its row of
# lib/README's table names under "uses" (read from there, not repeated
# here); a _priv.h header only from its own folder; kernels/ only core/.
cd "${top_srcdir:-.}" || exit 1
# The "uses" column of lib/README's table, one line per folder: "io core",
# "cli core io ... kernels"; a row continues on rows with an empty first
# cell; "kernels/mkv_cuda.h" names kernels, "every folder" all of them.
folders=$(awk -F'|' '/^\| [a-z]+\/ / { print $2 }' lib/README | tr -d ' /' | tr '\n' ' ')
rules=$(awk -F'|' -v all="$folders" '
    /^\|-/ { next }
    /^\| [a-z]+\/ / { if (name) print name, uses; name = $2; gsub(/[ \/]/, "", name); uses = "" }
    /^\| / && name { u = $4; gsub(/kernels\/mkv_cuda\.h|mkv_cuda\.h/, "kernels", u)
                     gsub(/every folder/, all, u); gsub(/\(nothing\)|,/, " ", u); uses = uses " " u }
    /^$/ && name { print name, uses; name = "" }
    END { if (name) print name, uses }' lib/README | awk '{ $1 = $1; print }')
allowed() {
    case $1 in
        kernels) echo "core kernels" ;;
        tools) echo "$folders kernels" ;;
        *) echo "$rules" | awk -v f="$1" '$1 == f { print }' ;;
    esac
}
bad=0
checked=0
for f in lib/*/*.[ch] kernels/*.cu kernels/*.cuh kernels/*.h tools/*.c; do
    case $f in
        lib/*) from=${f#lib/}; from=${from%%/*} ;;
        kernels/*) from=kernels ;;
        tools/*) from=tools ;;
    esac
    ok=$(allowed "$from")
    if [ -z "$ok" ]; then
        echo "layering: $f: folder '$from' is not in lib/README's table"
        bad=$((bad + 1)); continue
    fi
    # every quoted include of the file, as "line:header"
    for inc in $(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
                 sed 's/^\([0-9]*\):.*"\(.*\)".*/\1:\2/'); do
        line=${inc%%:*}; h=${inc#*:}
        checked=$((checked + 1))
        case $h in
            config.h) continue ;;
            */*) to=${h%%/*}; name=${h#*/} ;;
            *.cuh|mkv_cuda.h|cuda_check.h) to=kernels; name=$h ;;
            *) echo "layering: $f:$line: \"$h\" is not included by its folder (lib/README)"
               bad=$((bad + 1)); continue ;;
        esac
        if [ "$to" = kernels ] && [ ! -f "kernels/$name" ]; then
            echo "layering: $f:$line: \"$h\" does not exist"; bad=$((bad + 1)); continue
        fi
        if [ "$to" != kernels ] && [ ! -f "lib/$h" ]; then
            echo "layering: $f:$line: \"$h\" does not exist under lib/"; bad=$((bad + 1)); continue
        fi
        case " $ok " in
            *" $to "*) ;;
            *) echo "layering: $f:$line: $from/ may not include $h (it uses: $ok)"
               bad=$((bad + 1)); continue ;;
        esac
        case $name in
            *_priv.h) if [ "$to" != "$from" ]; then
                          echo "layering: $f:$line: $h is private to $to/"
                          bad=$((bad + 1))
                      fi ;;
        esac
    done
done
# The rule must have seen the tree: an empty scan is a broken test.
if [ "$checked" -lt 100 ]; then
    echo "layering: only $checked includes found; is top_srcdir right?"
    exit 1
fi
if [ "$bad" -gt 0 ]; then
    echo "layering: $bad include(s) break lib/README's rule"
    exit 1
fi
echo "layering: $checked includes obey lib/README"
