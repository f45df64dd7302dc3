package subscriptions

// Names returns the names of the group's subscriber definitions, in the
// order NewGroup was given them: with Tenants, the pairs Group.Subscriber
// takes (the rows an operator surface lists, such as
// admin.NewGroupHandler's). The definitions are fixed by NewGroup, so the
// result never changes; it is a copy, and safe for concurrent use.
func (g *Group) Names() []string {
	out := make([]string, len(g.defs))
	for i, def := range g.defs {
		out[i] = def.Name
	}
	return out
}
