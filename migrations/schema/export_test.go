package schema

// StatementsForTest exposes the file splitter.
func StatementsForTest(sql string) []string { return statements(sql) }

// ManifestForTest returns, per migration version, the objects Verify looks
// for in a dialect, each as "table NAME", "column TABLE.NAME" or
// "index NAME".
func ManifestForTest(dialect string) map[int64][]string {
	out := map[int64][]string{}
	for v, objs := range manifest[dialect] {
		out[v] = []string{} // an entry that creates nothing is an entry
		for _, o := range objs {
			out[v] = append(out[v], o.String())
		}
	}
	return out
}

// FilesForTest returns a dialect's migration files in order: version,
// base name and contents.
func FilesForTest(dialect string) ([]int64, []string, []string, error) {
	all, err := load(dialect)
	if err != nil {
		return nil, nil, nil, err
	}
	var versions []int64
	var names, bodies []string
	for _, m := range all {
		versions = append(versions, m.version)
		names = append(names, m.file)
		bodies = append(bodies, m.sql)
	}
	return versions, names, bodies, nil
}
