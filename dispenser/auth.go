package dispenser

// Credentials are one NATS user's credentials: at most one of User/Password, Token,
// NKeySeedFile and CredsFile. The zero value means "none given".
type Credentials struct {
	User         string
	Password     string
	Token        string
	NKeySeedFile string // a file holding an NKey user seed (SU...)
	CredsFile    string // a .creds file (JWT and seed)
}
