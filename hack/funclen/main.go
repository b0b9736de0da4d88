// Command funclen lists the longest functions (in lines, from the func
// keyword to the closing brace) of the non-test Go files under the given
// directories: the figure issue reviews compare before and after a reshaping.
//
//	go run ./hack/funclen -n 15 ./internal ./controllers ./cmd
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type fn struct {
	name  string
	where string
	lines int
}

func main() {
	n := flag.Int("n", 20, "how many functions to list")
	flag.Parse()
	roots := flag.Args()
	if len(roots) == 0 {
		roots = []string{"."}
	}
	fset := token.NewFileSet()
	var fns []fn
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasPrefix(d.Name(), "zz_generated") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				name := fd.Name.Name
				if fd.Recv != nil && len(fd.Recv.List) > 0 {
					name = recvName(fd.Recv.List[0].Type) + "." + name
				}
				start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
				fns = append(fns, fn{name: name, where: fmt.Sprintf("%s:%d", path, start.Line), lines: end.Line - start.Line + 1})
			}
			return nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	sort.Slice(fns, func(i, j int) bool {
		if fns[i].lines != fns[j].lines {
			return fns[i].lines > fns[j].lines
		}
		return fns[i].where < fns[j].where
	})
	for i, f := range fns {
		if i == *n {
			break
		}
		fmt.Printf("%4d  %-40s %s\n", f.lines, f.name, f.where)
	}
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}
